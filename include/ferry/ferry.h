/*
 * ferry.h — the whole public C API of libferry.
 *
 * Conventions (GDRCopy's, minus its errno/-1 mix):
 *  - every call returns a ferry_status_t; outputs come last, as pointers;
 *  - on failure ferry_last_error() returns a thread-local message that says what
 *    went wrong and with which value; it stays valid until the next failing call
 *    on the same thread;
 *  - handles are opaque typed pointers; create/destroy come in pairs. A call
 *    on a destroyed handle (use after destroy, double destroy) or on a handle
 *    of another kind returns FERRY_ERROR_INVALID_ARGUMENT saying so, as long as
 *    fewer than 4096 handles were destroyed after it. Undefined: a pointer that
 *    never was a ferry handle, a handle destroyed 4096 or more destroys ago, and
 *    destroying a handle while another thread still uses it;
 *  - fork(): pools, engines, copies and channels created before fork() refuse
 *    every call in the child with FERRY_ERROR_NOT_SUPPORTED (their threads,
 *    pinned memory and CUDA state belong to the parent); in the child,
 *    ferry_pool_free does nothing and destroy releases nothing (the child's
 *    copy of the memory goes with the child). New handles created in the child
 *    work (CUDA ones as far as CUDA allows after fork). The parent is unaffected;
 *  - no CUDA header is needed to use this header (streams are void*).
 *
 * A changed signature becomes NAME_v2 and the old one stays; FERRY_API_VERSION
 * is the version this header describes, ferry_get_api_version() the one the
 * loaded library implements.
 *
 * Structs grow without breaking callers (API 1.1 on). Every struct passed by
 * pointer (options in; stats and versions out) starts with `size_t
 * struct_size`:
 *  - set it to sizeof the struct before the call; the *_options_init calls do
 *    it for options (they fill the defaults and struct_size);
 *  - the library reads and writes only the members within struct_size: an
 *    options struct from an older (smaller) header gets the defaults for the
 *    members it lacks, a stats struct from an older header gets the members it
 *    has and nothing is written beyond it; on return from a call that fills a
 *    struct, struct_size is the number of bytes the library filled;
 *  - members of a newer header that the loaded library does not know are
 *    ignored in options and left untouched in outputs (compare
 *    ferry_get_api_version() to know which members it has);
 *  - struct_size must be a multiple of 8 from 8 to 4096, else
 *    FERRY_ERROR_INVALID_ARGUMENT (so an unset struct_size is caught).
 * Growing a struct: append members only (never reorder, retype or remove
 * one), keep its size a multiple of 8 with no tail padding (pad explicitly
 * with a `reserved` member that must be 0), and bump FERRY_API_MINOR. Structs
 * nested in others (ferry_counter_t, ferry_pool_kind_stats_t) never change.
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_API_MAJOR 1
/* 1.1: struct_size in every struct, ferry_managed_kind_t.
 * 1.2: ferry_copy_many, ferry_copy_many_async, the ferry_loader_* functions.
 * 1.3: the loader's mapped share removed (ferry_loader_options_t's member is
 *      retired_mapped_share, which must be 0; its stats members stay 0).
 * 1.4: ferry_copy_v2 and ferry_copy_many_v2 take a stream and a strategy in the
 *      order of the async calls; ferry_copy and ferry_copy_many are deprecated.
 * 1.5: the node pool (ferry_node_pool_*): one pool of host memory per node,
 *      shared by every process that opens it by name.
 * 1.6: the statuses FERRY_ERROR_TIMEOUT, FERRY_ERROR_PEER_GONE, FERRY_ERROR_BROKEN
 *      (for the node handoff of 1.8).
 * 1.7: one argument order and one release verb: every create/open call takes
 *      (what, options, device, out) with out last, and every handle is freed by
 *      its _destroy call: ferry_channel_create_v2, ferry_copy_destroy,
 *      ferry_registration_create / ferry_registration_destroy and
 *      ferry_node_pool_destroy are new; ferry_channel_create, ferry_copy_release,
 *      ferry_register / ferry_unregister and ferry_node_pool_close stay as
 *      deprecated aliases (same behaviour).
 * 1.8: the node handoff (ferry_handoff_*): batches of blocks from one process
 *      to another through a node pool, GPU to GPU where the GPUs reach each other.
 * 1.9: ferry_handoff_options_t.peer_sms (GPU to GPU, blocks under 1 MiB
 *      copied by an SM kernel) and ferry_handoff_stats_t.sm_batches. */
#define FERRY_API_MINOR 9
#define FERRY_API_VERSION ((FERRY_API_MAJOR << 16) | FERRY_API_MINOR)

#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#define FERRY_DEPRECATED(why) __attribute__((deprecated(why)))
#else
#define FERRY_API
#define FERRY_DEPRECATED(why)
#endif

typedef enum ferry_status {
  FERRY_SUCCESS = 0,
  FERRY_ERROR_INVALID_ARGUMENT = 1, /* bad pointer, size, alignment, option value */
  FERRY_ERROR_OUT_OF_MEMORY = 2,    /* OS, CUDA or a configured limit refused memory */
  FERRY_ERROR_OS = 3,               /* a system call failed; the message has errno */
  FERRY_ERROR_CUDA = 4,             /* a CUDA call failed; the message has its code */
  FERRY_ERROR_NO_DEVICE = 5,        /* no CUDA driver or no CUDA device */
  FERRY_ERROR_NOT_SUPPORTED = 6,    /* this machine cannot do it (e.g. no gdrdrv) */
  FERRY_ERROR_INTERNAL = 7,         /* a bug in ferry: please report it */
  FERRY_ERROR_TIMEOUT = 8,          /* (1.6) a bounded wait for another process ended: it did not keep up */
  FERRY_ERROR_PEER_GONE = 9,        /* (1.6) the process on the other side left (exited, died, closed) */
  FERRY_ERROR_BROKEN = 10           /* (1.6) an earlier error (either side) ended this handoff: open a new key */
} ferry_status_t;

/* Message of the last failing call on this thread ("" if none). */
FERRY_API const char* ferry_last_error(void);
/* Stable name of a status, e.g. "FERRY_ERROR_OUT_OF_MEMORY". */
FERRY_API const char* ferry_status_name(ferry_status_t status);

/* ---- versions ---------------------------------------------------------- */

typedef struct ferry_versions {
  size_t struct_size;        /* sizeof(ferry_versions_t), set by the caller */
  int api_major, api_minor;  /* C API implemented by the loaded library */
  char library[32];          /* e.g. "0.1.0" */
  int cuda_runtime;          /* e.g. 13000; the runtime ferry was built with */
  int cuda_driver;           /* e.g. 13000; 0 when no driver is installed */
} ferry_versions_t;

FERRY_API ferry_status_t ferry_get_api_version(int* major, int* minor);
/* out->struct_size must be set (see the top of this file). */
FERRY_API ferry_status_t ferry_get_versions(ferry_versions_t* out);

/* ---- options ----------------------------------------------------------- */
/* Options come from FERRY_* environment variables, read once. An unknown
 * FERRY_ key or a bad value makes this (and every call that needs options)
 * fail with FERRY_ERROR_INVALID_ARGUMENT, quoting the value. */
FERRY_API ferry_status_t ferry_options_check(void);
/* Number of options and the i-th option's name, default and documentation. */
FERRY_API ferry_status_t ferry_option_count(size_t* count);
FERRY_API ferry_status_t ferry_option_info(size_t index, const char** name,
                                           const char** default_value, const char** doc);

/* Fault injection for error-path tests: "call:N" makes call number N+1 of
 * that kind fail once; "call:N+" makes every call after the first N fail;
 * "=ERRNO" at the end (e.g. "madvise:0=EAGAIN") picks the errno reported.
 * Calls: mmap, madvise, memfd, touch, register; N: 0 .. 10^9, digits only.
 * Several rules separated by ','. "" clears. Also read from FERRY_FAULT_INJECT
 * at start. A bad spec changes nothing and fails quoting the bad rule. */
FERRY_API ferry_status_t ferry_set_fault_injection(const char* spec);

/* ---- devices ----------------------------------------------------------- */

/* Number of CUDA devices; FERRY_ERROR_NO_DEVICE (with the reason) when there
 * is no driver or no device. */
FERRY_API ferry_status_t ferry_device_count(int* count);


/* ---- host pool and pinned pool ------------------------------------------ */
/* Exact-size host allocations carved from 2 MiB-aligned chunks that are huge-
 * page (hugetlb or THP) or small-page backed, recycled on free, returned to the
 * OS on trim or by a throttled background releaser. A pinned pool registers
 * each chunk with the CUDA driver once, so its allocations are pinned. */

typedef struct ferry_pool* ferry_pool_t;

typedef enum ferry_huge {
  FERRY_HUGE_AUTO = 0, /* huge pages for allocations of 2 MiB and more */
  FERRY_HUGE_YES = 1,
  FERRY_HUGE_NO = 2
} ferry_huge_t;

typedef enum ferry_huge_policy {
  FERRY_HUGE_POLICY_AUTO = 0, /* hugetlb pages if reserved, else THP */
  FERRY_HUGE_POLICY_HUGETLB = 1,
  FERRY_HUGE_POLICY_THP = 2,
  FERRY_HUGE_POLICY_OFF = 3
} ferry_huge_policy_t;

typedef struct ferry_pool_options {
  size_t struct_size;          /* sizeof(ferry_pool_options_t): ferry_pool_options_init sets it */
  size_t chunk_bytes;          /* multiple of 2 MiB; default FERRY_CHUNK_SIZE (64 MiB) */
  int memfd;                   /* 1: back chunks by memfd (shareable); default 0 */
  ferry_huge_policy_t huge_pages;
  size_t limit_bytes;          /* hard limit on reserved bytes; 0 = none */
  int zero_recycled;           /* zero recycled memory before reuse */
  int touch_threads;           /* 0 .. 1024; 0 = one per core, at most 16 */
  int64_t release_delay_ms;    /* background release after this idle time, 0 .. 86400000 (a day);
                                  0 = only trim */
  size_t release_batch_bytes;  /* cap per background round */
  int numa_node;               /* 0 .. 1023; -1: none (pinned pools: the GPU's node); -2: never bind */
  size_t target_bytes;         /* reserve (and pin) this much in the background at creation;
                                  more than the machine's memory: FERRY_ERROR_OUT_OF_MEMORY */
} ferry_pool_options_t;

typedef struct ferry_counter {
  uint64_t current, peak, total;
} ferry_counter_t;

typedef struct ferry_pool_kind_stats {
  ferry_counter_t reserved, committed, in_use, cached, released;
} ferry_pool_kind_stats_t;

typedef struct ferry_pool_stats {
  size_t struct_size; /* sizeof(ferry_pool_stats_t), set by the caller */
  ferry_pool_kind_stats_t small, huge;
  uint64_t allocations, frees, recycles, chunk_reservations, chunk_releases, fallbacks;
  uint64_t touch_ns, register_ns;
  uint64_t chunks_small_pages, chunks_thp, chunks_hugetlb_2m, chunks_hugetlb_1g;
  size_t note_count; /* fallbacks remembered; read them with ferry_pool_get_note */
} ferry_pool_stats_t;

/* Fills the members within out->struct_size with the defaults (from FERRY_*
 * options). ferry_pool_options_init (below) sets struct_size first. */
FERRY_API ferry_status_t ferry_pool_options_defaults(ferry_pool_options_t* out);
/* Fills *out with the defaults, struct_size included. */
static inline ferry_status_t ferry_pool_options_init(ferry_pool_options_t* out) {
  if (out) out->struct_size = sizeof *out;
  return ferry_pool_options_defaults(out);
}
/* options may be NULL (defaults). A value out of its range above:
 * FERRY_ERROR_INVALID_ARGUMENT naming the field and quoting the value. */
FERRY_API ferry_status_t ferry_pool_create(const ferry_pool_options_t* options, ferry_pool_t* out);
FERRY_API ferry_status_t ferry_pinned_pool_create(const ferry_pool_options_t* options, int device,
                                                  ferry_pool_t* out);
/* Releases every chunk (unpinning first). Live allocations become invalid. */
FERRY_API ferry_status_t ferry_pool_destroy(ferry_pool_t pool);
/* alignment: power of two up to 2 MiB; 0 means 256. */
FERRY_API ferry_status_t ferry_pool_alloc(ferry_pool_t pool, size_t bytes, size_t alignment,
                                          ferry_huge_t huge, void** out);
/* Double free, foreign or interior pointer: FERRY_ERROR_INVALID_ARGUMENT, nothing changed. */
FERRY_API ferry_status_t ferry_pool_free(ferry_pool_t pool, void* ptr);
FERRY_API ferry_status_t ferry_pool_trim(ferry_pool_t pool, size_t keep_bytes, size_t* released);
/* Waits until options.target_bytes are reserved and ready. */
FERRY_API ferry_status_t ferry_pool_wait_ready(ferry_pool_t pool);
/* out->struct_size must be set (see the top of this file). */
FERRY_API ferry_status_t ferry_pool_get_stats(ferry_pool_t pool, ferry_pool_stats_t* out);
/* The i-th remembered fallback note; valid until the next call on this thread. */
FERRY_API ferry_status_t ferry_pool_get_note(ferry_pool_t pool, size_t index, const char** note);

/* ---- copy engine --------------------------------------------------------- */
/* Copies between any host memory (pageable or pinned, any alignment) and device
 * memory, both directions. Pageable memory moves through pinned staging slots
 * (CPU copy overlapped with DMA) or is pinned in place piece by piece; pinned
 * memory goes straight to the DMA engine. An async copy is fully enqueued when
 * the call returns: the caller's stream is ordered after it. An async
 * host->device copy below the profile's eager_async_below_bytes (64 MiB by
 * default) has read its pageable source when the call returns; otherwise
 * pageable host memory of an async copy must not be touched until the copy is
 * done (ferry_copy_wait returned or ferry_copy_query said done). No call
 * leaves the calling thread's current device changed. */

typedef struct ferry_engine* ferry_engine_t;
typedef struct ferry_copy_state* ferry_copy_t;
typedef struct ferry_registration* ferry_registration_t;

typedef enum ferry_strategy {
  FERRY_STRATEGY_AUTO = 0,
  FERRY_STRATEGY_DIRECT = 1,       /* pinned host memory: one DMA */
  FERRY_STRATEGY_STAGED = 2,       /* pageable: through pinned staging slots */
  FERRY_STRATEGY_PIN_IN_PLACE = 3, /* pageable: register pieces ahead of the DMA */
  FERRY_STRATEGY_HYBRID = 4,       /* staged and pinned in place at once */
  FERRY_STRATEGY_CUDA = 5,         /* the CUDA runtime's own pageable path */
  FERRY_STRATEGY_SM = 6            /* pinned memory: a copy kernel on a few SMs (batches of small blocks) */
} ferry_strategy_t;

/* An engine owns its staging memory, worker threads and streams (one per
 * direction). Options come from FERRY_COPY_* and the machine profile. */
FERRY_API ferry_status_t ferry_engine_create(int device, ferry_engine_t* out);
FERRY_API ferry_status_t ferry_engine_destroy(ferry_engine_t engine);
/* Synchronous copy on `stream` (a cudaStream_t, NULL = legacy stream) by
 * `strategy`; returns when the bytes are in place. Every copy call takes its
 * arguments in one order: what (dst, src, bytes), where it is ordered
 * (stream), how (strategy), then outputs. */
FERRY_API ferry_status_t ferry_copy_v2(ferry_engine_t engine, void* dst, const void* src, size_t bytes, void* stream,
                                       ferry_strategy_t strategy);
/* Deprecated (1.4): ferry_copy_v2 with stream NULL and FERRY_STRATEGY_AUTO. */
FERRY_API FERRY_DEPRECATED("use ferry_copy_v2") ferry_status_t ferry_copy(ferry_engine_t engine, void* dst,
                                                                          const void* src, size_t bytes);
/* Asynchronous copy on `stream` (a cudaStream_t, NULL = legacy stream). *out
 * must be freed with ferry_copy_destroy. */
FERRY_API ferry_status_t ferry_copy_async(ferry_engine_t engine, void* dst, const void* src, size_t bytes,
                                          void* stream, ferry_strategy_t strategy, ferry_copy_t* out);
/* Many items in one call: any mix of pageable, registered and pinned host
 * buffers with device buffers of the engine's device, both directions. Pinned
 * items go to the DMA engines as one batch (small ones to a copy kernel on a
 * few SMs); pageable items move through ONE staged run (item i+1 is staged
 * while item i's DMA runs; small items share staging chunks). Every item is
 * checked before any work starts: a bad one fails the call with
 * FERRY_ERROR_INVALID_ARGUMENT and a message naming its index ("item 6 of
 * 10: ..."). The async call returns once the host->device sources are staged
 * (they may be reused at once); its device->host items are done when the copy
 * is. strategy: FERRY_STRATEGY_AUTO, or one for every item. stream NULL:
 * the copy runs on a stream of the engine's, one per direction (so that two
 * threads copying opposite ways overlap), after the work queued on the legacy
 * default stream before the call; later work waits on the copy's event or
 * ferry_copy_wait, not on the legacy stream. stream cudaStreamLegacy: the
 * legacy stream itself (later work queued there runs after the copy). */
FERRY_API ferry_status_t ferry_copy_many_async(ferry_engine_t engine, void* const* dsts, const void* const* srcs,
                                               const size_t* sizes, size_t count, void* stream,
                                               ferry_strategy_t strategy, ferry_copy_t* out);
/* The same, returning when every item is in place. */
FERRY_API ferry_status_t ferry_copy_many_v2(ferry_engine_t engine, void* const* dsts, const void* const* srcs,
                                            const size_t* sizes, size_t count, void* stream,
                                            ferry_strategy_t strategy);
/* Deprecated (1.4): ferry_copy_many_v2 with FERRY_STRATEGY_AUTO. */
FERRY_API FERRY_DEPRECATED("use ferry_copy_many_v2") ferry_status_t
ferry_copy_many(ferry_engine_t engine, void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                void* stream);
/* Deprecated: ferry_copy_many_async with FERRY_STRATEGY_AUTO (the earlier
 * name, kept for the C ABI: old signatures stay). */
FERRY_API FERRY_DEPRECATED("use ferry_copy_many_async") ferry_status_t
ferry_copy_batch_async(ferry_engine_t engine, void* const* dsts, const void* const* srcs, const size_t* sizes,
                       size_t count, void* stream, ferry_copy_t* out);
FERRY_API ferry_status_t ferry_copy_wait(ferry_copy_t copy);
FERRY_API ferry_status_t ferry_copy_query(ferry_copy_t copy, int* done);
/* The cudaEvent_t recorded when the copy is done (owned by the copy). */
FERRY_API ferry_status_t ferry_copy_get_event(ferry_copy_t copy, void** event);
FERRY_API ferry_status_t ferry_copy_get_strategy(ferry_copy_t copy, ferry_strategy_t* strategy);
/* Destroying a copy that is not done waits for it first. */
FERRY_API ferry_status_t ferry_copy_destroy(ferry_copy_t copy);
/* Deprecated (1.7): ferry_copy_destroy. */
FERRY_API FERRY_DEPRECATED("use ferry_copy_destroy") ferry_status_t ferry_copy_release(ferry_copy_t copy);

/* Pin a user buffer that will be copied many times (widened to whole huge
 * pages where mapped); copies from or to it then run at pinned speed.
 * ferry_registration_destroy unpins it. */
FERRY_API ferry_status_t ferry_registration_create(void* ptr, size_t bytes, int device, ferry_registration_t* out);
FERRY_API ferry_status_t ferry_registration_destroy(ferry_registration_t registration);
/* Deprecated (1.7): ferry_registration_create and ferry_registration_destroy. */
FERRY_API FERRY_DEPRECATED("use ferry_registration_create") ferry_status_t
ferry_register(void* ptr, size_t bytes, int device, ferry_registration_t* out);
FERRY_API FERRY_DEPRECATED("use ferry_registration_destroy") ferry_status_t
ferry_unregister(ferry_registration_t registration);

/* ---- low-latency channel ------------------------------------------------ */
/* Small copies and signals between the CPU and one GPU in about a microsecond:
 * a persistent GPU kernel serves a ring of requests in mapped pinned memory and
 * leaves by itself after idle_us without requests (the next request relaunches
 * it), so cudaDeviceSynchronize() never hangs on it. Every call is synchronous
 * and thread-safe; one thread's requests complete in its order. Device
 * pointers must lie inside one allocation of the channel's device. Payloads are
 * 1 .. FERRY_CHANNEL_MAX_PAYLOAD bytes; larger transfers are the copy engine's
 * job (FERRY_ERROR_INVALID_ARGUMENT says so). A request that does not complete
 * within timeout_ms fails with FERRY_ERROR_CUDA and leaves the channel unusable. */

#define FERRY_CHANNEL_MAX_PAYLOAD 65536

typedef struct ferry_channel* ferry_channel_t;

typedef struct ferry_channel_options {
  size_t struct_size;  /* sizeof(ferry_channel_options_t): ferry_channel_options_init sets it */
  uint32_t idle_us;    /* the kernel leaves after this idle time; default 200, 1 .. 10^7 */
  uint32_t slots;      /* requests in flight at once; default 8, 1 .. 64 */
  uint32_t timeout_ms; /* a request not done by then fails; default 5000 */
  uint32_t spin_us;    /* callers spin this long, then yield and sleep; default 20 */
  int use_gdrcopy;     /* 1: writes through GDRCopy mappings; FERRY_ERROR_NOT_SUPPORTED
                          (with the reason) where GDRCopy is not available */
  uint32_t reserved;   /* 0 (keeps the size a multiple of 8) */
} ferry_channel_options_t;

typedef struct ferry_channel_stats {
  size_t struct_size;      /* sizeof(ferry_channel_stats_t), set by the caller */
  uint64_t requests;       /* completed requests */
  uint64_t launches;       /* kernel launches (first request, then relaunches after idle) */
  uint64_t idle_exits;     /* kernels that left because they were idle */
  uint64_t gdrcopy_writes; /* writes done through a GDRCopy mapping */
} ferry_channel_stats_t;

/* Fills the members within out->struct_size with the defaults;
 * ferry_channel_options_init (below) sets struct_size first. */
FERRY_API ferry_status_t ferry_channel_options_defaults(ferry_channel_options_t* out);
/* Fills *out with the defaults, struct_size included. */
static inline ferry_status_t ferry_channel_options_init(ferry_channel_options_t* out) {
  if (out) out->struct_size = sizeof *out;
  return ferry_channel_options_defaults(out);
}
/* options may be NULL (defaults). FERRY_ERROR_NO_DEVICE without driver or device. */
FERRY_API ferry_status_t ferry_channel_create_v2(const ferry_channel_options_t* options, int device,
                                                 ferry_channel_t* out);
/* Deprecated (1.7): ferry_channel_create_v2, whose arguments are in the order
 * of every other create call (options, device, out). */
FERRY_API FERRY_DEPRECATED("use ferry_channel_create_v2") ferry_status_t
ferry_channel_create(int device, const ferry_channel_options_t* options, ferry_channel_t* out);
/* Stops the kernel and frees everything; waits for requests in flight. */
FERRY_API ferry_status_t ferry_channel_destroy(ferry_channel_t channel);
FERRY_API ferry_status_t ferry_channel_write(ferry_channel_t channel, void* dev_dst, const void* src,
                                             size_t n);
FERRY_API ferry_status_t ferry_channel_read(ferry_channel_t channel, void* dst, const void* dev_src,
                                            size_t n);
/* value: 0 .. 255 */
FERRY_API ferry_status_t ferry_channel_fill(ferry_channel_t channel, void* dev_dst, int value,
                                            size_t n);
/* Stores value to a 4-byte aligned device flag, release semantics at system scope. */
FERRY_API ferry_status_t ferry_channel_signal(ferry_channel_t channel, uint32_t* dev_flag,
                                              uint32_t value);
/* The kernel waits until *dev_flag >= value (unsigned) or timeout_us (at most
 * 3600 s) passes: *reached is 1 or 0. The wait holds the whole channel. */
FERRY_API ferry_status_t ferry_channel_wait(ferry_channel_t channel, const uint32_t* dev_flag,
                                            uint32_t value, uint64_t timeout_us, int* reached);
/* Round trip of an empty request, in microseconds. */
FERRY_API ferry_status_t ferry_channel_ping(ferry_channel_t channel, double* round_trip_us);
/* out->struct_size must be set (see the top of this file). */
FERRY_API ferry_status_t ferry_channel_get_stats(ferry_channel_t channel,
                                                 ferry_channel_stats_t* out);
/* Whether GDRCopy (libgdrapi.so.2 and /dev/gdrdrv) can be used here; *reason
 * says why not, or what was found (static storage). reason may be NULL. */
FERRY_API ferry_status_t ferry_gdrcopy_available(int* available, const char** reason);
/* ---- end of low-latency channel ----------------------------------------- */

/* ---- managed memory allocators for PyTorch -------------------------------- */
/* Three device-side allocators for torch.cuda.memory.CUDAPluggableAllocator:
 *   "device"       cudaMalloc / cudaFree;
 *   "managed"      cudaMallocManaged per allocation (prefetch, advice optional);
 *   "managed_pool" size-class blocks carved from cudaMallocManaged chunks, reused
 *                  in stream order (events on the freeing stream), prefetched
 *                  to the device on allocation.
 * PyTorch loads their entry points by name from libferry.so; their signatures
 * are the ones torch/csrc/cuda/CUDAPluggableAllocator.h calls (a CUDA stream is
 * a cudaStream_t), so they are not declared here:
 *   void* ferry_torch_alloc_NAME(ssize_t size, int device, cudaStream_t stream);
 *   void  ferry_torch_free_NAME(void* ptr, ssize_t size, int device, cudaStream_t stream);
 * They never throw: a failed allocation returns NULL (its message goes to
 * stderr, to ferry_last_error() on that thread and to the stats), and size 0
 * returns NULL. The size passed to free is not trusted; each allocator keeps
 * its own record. Managed memory is never asked for beyond what cudaMemGetInfo
 * reports free, nor beyond the device's total together with what ferry
 * already holds there, unless the option oversubscribe=1 is set.
 *
 * Options: "key=value,key=value" ("" or NULL = defaults): prefetch (managed:
 * 0|1, default 0; managed_pool: 0|1|alloc|chunk, default alloc), advise (none
 * or preferred_location, accessed_by, read_mostly joined by '+'),
 * oversubscribe (0|1, default 0), chunk_bytes (managed_pool, multiple of
 * 2 MiB, default 64MiB), stream_wait (managed_pool, 0|1, default 1). "device"
 * takes none. Unknown names, keys and values: FERRY_ERROR_INVALID_ARGUMENT
 * with the value quoted. Configuration applies to later allocations. */

/* The allocators as an enum; every call below takes the name
 * (ferry_managed_kind_name gives it). */
typedef enum ferry_managed_kind {
  FERRY_MANAGED_DEVICE = 0,      /* "device" */
  FERRY_MANAGED_MANAGED = 1,     /* "managed" */
  FERRY_MANAGED_MANAGED_POOL = 2 /* "managed_pool" */
} ferry_managed_kind_t;

/* "device", "managed" or "managed_pool"; NULL for a value not in the enum. */
FERRY_API const char* ferry_managed_kind_name(ferry_managed_kind_t kind);
/* The kind of a name; FERRY_ERROR_INVALID_ARGUMENT (quoting it) for others. */
FERRY_API ferry_status_t ferry_managed_kind_from_name(const char* name, ferry_managed_kind_t* out);

typedef struct ferry_managed_stats {
  size_t struct_size;                 /* sizeof(ferry_managed_stats_t), set by the caller */
  uint64_t allocated, allocated_peak; /* bytes in live allocations (pool: block sizes) */
  uint64_t requested;                 /* bytes asked for by live allocations */
  uint64_t reserved, reserved_peak;   /* bytes obtained from CUDA */
  uint64_t allocations, frees;
  uint64_t failures;                  /* allocations that returned NULL */
  uint64_t prefetched_bytes, prefetches;
  uint64_t chunks;                    /* managed_pool: chunks held */
  uint64_t reuse_same_stream, reuse_after_fence, reuse_by_wait; /* managed_pool */
} ferry_managed_stats_t;

FERRY_API ferry_status_t ferry_managed_configure(const char* name, const char* options);
/* device -1: the sum over all devices. out->struct_size must be set (see the
 * top of this file). */
FERRY_API ferry_status_t ferry_managed_get_stats(const char* name, int device,
                                                 ferry_managed_stats_t* out);
/* managed_pool: gives back to CUDA every chunk with no live block and no
 * pending work (others release at free and report 0). released may be NULL. */
FERRY_API ferry_status_t ferry_managed_trim(const char* name, int device, size_t* released);
/* ---- end of managed memory allocators ------------------------------------- */

/* ---- checkpoint loader ---------------------------------------------------- */
/* Byte ranges of files to device memory: several reader threads pread (or
 * O_DIRECT-read) into a small ring of pinned staging slots while the previous
 * slots' DMAs run; host memory added is the staging size, never the file.
 * Optionally (experimental) a share of page-cached bytes is DMA'd straight
 * from a read-only file mapping registered with cudaHostRegisterReadOnly.
 * ferry_loader_load is synchronous: it returns when every byte is in device
 * memory; it starts after the work queued on `stream` before the call. One
 * load at a time per loader. A failure (short file, read error, CUDA error)
 * fails the whole load with a message naming the file and byte range; no
 * thread stays busy and nothing stays registered; the destinations' contents
 * are then undefined. */

typedef struct ferry_loader* ferry_loader_t;

typedef enum ferry_direct_io {
  FERRY_DIRECT_IO_AUTO = 0,   /* O_DIRECT for files mostly not in the page cache */
  FERRY_DIRECT_IO_NEVER = 1,
  FERRY_DIRECT_IO_ALWAYS = 2  /* where the file system allows it */
} ferry_direct_io_t;

typedef struct ferry_loader_options {
  size_t struct_size;           /* sizeof(ferry_loader_options_t): ferry_loader_options_init sets it */
  size_t staging_bytes;         /* pinned slots in all; default FERRY_LOAD_STAGING (512 MiB) */
  size_t slot_bytes;            /* one read; a multiple of 4 KiB; default FERRY_LOAD_SLOT (16 MiB) */
  int threads;                  /* reader threads; 0 = one per core, at most 16 */
  ferry_direct_io_t direct_io;
  double retired_mapped_share;  /* 0 (API 1.3: the mapped share was removed; anything else is refused) */
  int progress;                 /* -1: when stderr is a terminal (default); 0: never; 1: always */
  uint32_t reserved;            /* 0 (keeps the size a multiple of 8) */
} ferry_loader_options_t;

typedef struct ferry_load_range { /* an array element: never grows */
  size_t file;      /* index into the files array */
  uint64_t offset;  /* in the file */
  uint64_t bytes;   /* 0: skipped */
  void* dst;        /* device memory */
} ferry_load_range_t;

typedef struct ferry_load_stats {
  size_t struct_size;     /* sizeof(ferry_load_stats_t), set by the caller */
  uint64_t bytes;         /* delivered */
  uint64_t read_bytes;    /* read from files (merged gaps, O_DIRECT alignment) */
  uint64_t staged_bytes;  /* read bytes that went through the staging slots */
  uint64_t mapped_bytes;  /* 0 (API 1.3: the mapped share was removed) */
  uint64_t reads, direct_reads;
  uint64_t registrations; /* 0 (API 1.3) */
  double seconds;
  double register_seconds, unregister_seconds; /* 0 (API 1.3) */
  size_t staging_bytes;   /* pinned memory the loader holds */
} ferry_load_stats_t;

/* Fills the members within out->struct_size with the defaults (from
 * FERRY_LOAD_* options); ferry_loader_options_init (below) sets struct_size first. */
FERRY_API ferry_status_t ferry_loader_options_defaults(ferry_loader_options_t* out);
/* Fills *out with the defaults, struct_size included. */
static inline ferry_status_t ferry_loader_options_init(ferry_loader_options_t* out) {
  if (out) out->struct_size = sizeof *out;
  return ferry_loader_options_defaults(out);
}
/* options may be NULL (defaults). Allocates and pins the staging slots. */
FERRY_API ferry_status_t ferry_loader_create(const ferry_loader_options_t* options, int device,
                                             ferry_loader_t* out);
FERRY_API ferry_status_t ferry_loader_destroy(ferry_loader_t loader);
/* stats may be NULL (else its struct_size set). Ranges must not overlap in
 * device memory (two ranges may read the same file bytes). */
FERRY_API ferry_status_t ferry_loader_load(ferry_loader_t loader, const char* const* files, size_t file_count,
                                           const ferry_load_range_t* ranges, size_t range_count, void* stream,
                                           ferry_load_stats_t* stats);
/* ---- end of checkpoint loader --------------------------------------------- */

/* ---- node pool (API 1.5) ----------------------------------------------------
 * One pool of host memory per node, shared by every process that opens it by
 * name: one memfd every member maps (the pages exist once), one byte budget
 * for the allocations of all, blocks reachable from any member by their
 * offset (the handle), named blocks held by every process that asked for
 * them, 32-bit signal words (futex) for completions. Processes find each
 * other over Unix sockets in a directory only their user may enter
 * (FERRY_NODE_DIR, else /tmp/ferry-<euid>, mode 0700); each side checks the
 * other's uid, so no other user can serve, block or stall an open. A
 * member's unnamed blocks are freed when it destroys its handle, exits or
 * dies (SIGKILL included: the others notice and reclaim); take() moves one to
 * another member. Pinning: ferry_node_pool_register pins a range for one
 * device in this process (each process pins only what it uses). A forked
 * child does not see the pool (its calls fail NOT_SUPPORTED). */
typedef struct ferry_node_pool* ferry_node_pool_t;

typedef struct ferry_node_pool_options {
  size_t struct_size;     /* sizeof(ferry_node_pool_options_t) */
  size_t capacity;        /* the creator's budget in bytes; 0 = attach only */
  size_t granule;         /* allocation unit (creator only): power of two, 4 KiB .. 1 GiB; default 64 KiB */
  const char* label;      /* this process in messages, e.g. "rank 3"; NULL = "pid N" */
  double attach_timeout_s;/* seconds an open may wait (a concurrent open, members' answers); default 10;
                           * INFINITY: no limit; negative or NaN: FERRY_ERROR_INVALID_ARGUMENT */
  /* The creator's pages follow FERRY_HUGE_PAGES: 2 MiB hugetlb pages when enough
   * are free (auto), else shmem; pieces pinned per FERRY_NODE_PIN_PIECE. */
} ferry_node_pool_options_t;

FERRY_API ferry_status_t ferry_node_pool_options_defaults(ferry_node_pool_options_t* out);
static inline ferry_status_t ferry_node_pool_options_init(ferry_node_pool_options_t* out) {
  if (out) out->struct_size = sizeof *out;
  return ferry_node_pool_options_defaults(out);
}
/* Attaches to the pool `name` (1-64 of [A-Za-z0-9._-]) or creates it. */
FERRY_API ferry_status_t ferry_node_pool_open(const char* name, const ferry_node_pool_options_t* options,
                                              ferry_node_pool_t* out);
/* Destroys this process's handle: unpins and unmaps what it mapped, lets go of
 * its blocks' claims; the pool's memory lives on while another process has it open. */
FERRY_API ferry_status_t ferry_node_pool_destroy(ferry_node_pool_t pool);
/* Deprecated (1.7): ferry_node_pool_destroy. */
FERRY_API FERRY_DEPRECATED("use ferry_node_pool_destroy") ferry_status_t ferry_node_pool_close(ferry_node_pool_t pool);
/* Where the data starts in this process, and its size (the budget). */
FERRY_API ferry_status_t ferry_node_pool_data(ferry_node_pool_t pool, void** data, size_t* capacity);
/* An unnamed block owned by this process: its handle (offset from data) and size. */
FERRY_API ferry_status_t ferry_node_pool_alloc(ferry_node_pool_t pool, size_t bytes, uint64_t* handle,
                                               size_t* block_bytes);
/* The block called key (made if absent; *created says which); held until released. */
FERRY_API ferry_status_t ferry_node_pool_alloc_named(ferry_node_pool_t pool, const char* key, size_t bytes,
                                                     uint64_t* handle, size_t* block_bytes, int* created);
/* The size of the live block with this handle (from any member). */
FERRY_API ferry_status_t ferry_node_pool_find(ferry_node_pool_t pool, uint64_t handle, size_t* block_bytes);
/* Frees an unnamed block, or lets go of a named one. */
FERRY_API ferry_status_t ferry_node_pool_release(ferry_node_pool_t pool, uint64_t handle);
/* This process becomes the owner of an unnamed block. */
FERRY_API ferry_status_t ferry_node_pool_take(ferry_node_pool_t pool, uint64_t handle);
/* The 32-bit word at data + offset: add n (returns the value before) and wake
 * waiters; wait until it is >= value (timeout_s < 0: no limit; *reached 0 on timeout). */
FERRY_API ferry_status_t ferry_node_pool_add(ferry_node_pool_t pool, uint64_t offset, uint32_t n,
                                             uint32_t* before);
FERRY_API ferry_status_t ferry_node_pool_wait(ferry_node_pool_t pool, uint64_t offset, uint32_t value,
                                              double timeout_s, int* reached);
/* Pins [offset, offset + bytes) of the data for `device` in this process (in
 * 64 MiB pieces; background threads) and waits until it is pinned. Pins stay
 * until ferry_node_pool_destroy. */
FERRY_API ferry_status_t ferry_node_pool_register(ferry_node_pool_t pool, int device, uint64_t offset,
                                                  size_t bytes);
/* ---- end of node pool ------------------------------------------------------ */

/* ---- node handoff (API 1.8) -------------------------------------------------
 * A ring of slots in a named block of a node pool that hands batches of blocks
 * (KV caches) from one process (the producer: ferry_handoff_send) to another
 * (the consumer: ferry_handoff_recv, the same sizes in the same order). Both
 * open the same key with the same slots and slot_bytes. The protocol is
 * written down in src/node/handoff.h. Each send is cut into slots (items at
 * 256-byte boundaries); per slot one batched copy in, one out, the two sides
 * overlapping. Routes: where both sides give a GPU (device >= 0) and the
 * producer's GPU reaches the consumer's (the same GPU, or peer access), the
 * consumer's first recv publishes a ring on its GPU (CUDA IPC) and the slots go
 * GPU to GPU (FERRY_HANDOFF_ROUTE_AUTO, when that recv's destinations are on
 * its GPU); otherwise, and for slots sent before the consumer published,
 * through the pool's host slots (pinned for `device`). device -1: host memory
 * on both ends (memcpy). Waits are bounded (timeout_s) and watch the peer:
 * FERRY_ERROR_PEER_GONE when it left the pool, FERRY_ERROR_TIMEOUT when it did
 * not keep up; after either the handoff is broken (FERRY_ERROR_BROKEN on both
 * sides): open a new key. One call at a time per handle; the block is freed
 * when both sides destroyed their handles (a producer that leaves early loses
 * what was not received: ferry_handoff_drain first). */
typedef struct ferry_handoff* ferry_handoff_t;

typedef enum ferry_handoff_route {
  FERRY_HANDOFF_ROUTE_AUTO = 0, /* GPU to GPU where it can, else the pool */
  FERRY_HANDOFF_ROUTE_POOL = 1, /* always the pool's host slots (e.g. an offload tier in host memory) */
  FERRY_HANDOFF_ROUTE_PEER = 2  /* GPU to GPU or FERRY_ERROR_NOT_SUPPORTED */
} ferry_handoff_route_t;

typedef struct ferry_handoff_options {
  size_t struct_size;   /* sizeof(ferry_handoff_options_t): ferry_handoff_options_init sets it */
  uint32_t slots;       /* 1 .. 4096; default 4 */
  uint32_t route;       /* a ferry_handoff_route_t; default FERRY_HANDOFF_ROUTE_AUTO */
  uint64_t slot_bytes;  /* 1 .. 2^44, rounded up to 4 KiB; default 64 MiB */
  double timeout_s;     /* a wait's limit; default 60; INFINITY: none; negative or NaN: INVALID_ARGUMENT */
  double poll_s;        /* how often a wait checks the peer; > 0; default 0.25 */
  /* 1.9: GPU to GPU, a slot's blocks under 1 MiB (where all are memory of this
   * side's GPU) are copied by an SM kernel on at most this many SMs, not one copy
   * engine descriptor per block; 0 .. 1024, default 32; 0: copy engines only */
  int32_t peer_sms;
  uint32_t reserved;    /* must be 0 */
} ferry_handoff_options_t;

typedef struct ferry_handoff_stats {
  size_t struct_size;                         /* sizeof(ferry_handoff_stats_t), set by the caller */
  uint64_t sent, received;                    /* slots this handle moved */
  uint64_t pool_slots, peer_slots;            /* of those, through the pool / GPU to GPU */
  uint64_t last_pool_slots, last_peer_slots;  /* the last send or recv call's */
  uint64_t pending;                           /* slots sent and not yet drained (both sides) */
  uint64_t sm_batches;                        /* 1.9: slots this side copied with SMs (peer_sms) */
} ferry_handoff_stats_t;

FERRY_API ferry_status_t ferry_handoff_options_defaults(ferry_handoff_options_t* out);
static inline ferry_status_t ferry_handoff_options_init(ferry_handoff_options_t* out) {
  if (out) out->struct_size = sizeof *out;
  return ferry_handoff_options_defaults(out);
}
/* Opens this side of the handoff `key` (options NULL: defaults). device: the
 * GPU this side copies with (its copies use a copy engine of the handle's own),
 * or -1 for host memory only. Waits (at most timeout_s) for the side that made
 * the block to have written its header. INVALID_ARGUMENT names both sides'
 * slots and slot_bytes when they differ. */
FERRY_API ferry_status_t ferry_handoff_open(ferry_node_pool_t pool, const char* key,
                                            const ferry_handoff_options_t* options, int device,
                                            ferry_handoff_t* out);
/* Lets go of the block; a consumer's device ring is freed once the producer let
 * go of it (waiting at most timeout_s, else it is leaked, never freed under a
 * live mapping). */
FERRY_API ferry_status_t ferry_handoff_destroy(ferry_handoff_t handoff);
/* Producer: count items (srcs[i], sizes[i] bytes; 0 allowed); returns when each
 * slot's copy landed in the ring. stream_bytes (may be NULL): the stream's size. */
FERRY_API ferry_status_t ferry_handoff_send(ferry_handoff_t handoff, const void* const* srcs, const uint64_t* sizes,
                                            size_t count, uint64_t* stream_bytes);
/* Consumer: the next send's items into dsts (the same sizes: else
 * INVALID_ARGUMENT and nothing is consumed). */
FERRY_API ferry_status_t ferry_handoff_recv(ferry_handoff_t handoff, void* const* dsts, const uint64_t* sizes,
                                            size_t count, uint64_t* stream_bytes);
/* Producer: waits until every slot sent was drained (timeout_s: INFINITY none). */
FERRY_API ferry_status_t ferry_handoff_drain(ferry_handoff_t handoff, double timeout_s);
/* out->struct_size must be set (see the top of this file). */
FERRY_API ferry_status_t ferry_handoff_get_stats(ferry_handoff_t handoff, ferry_handoff_stats_t* out);
/* ---- end of node handoff ---------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_H */
