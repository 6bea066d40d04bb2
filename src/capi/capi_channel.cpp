// capi_channel.cpp — C API over ferry::cuda::Channel and the GDRCopy probe.
// A ferry_channel owns its Channel; destroy closes it (and frees the handle
// even when closing fails, which it reports).
#include <memory>

#include "capi/guard.h"
#include "capi/struct_size.h"
#include "cuda/channel/channel.h"
#include "cuda/channel/gdrcopy.h"

using ferry::capi::guarded;
using ferry::capi::live;
using ferry::capi::read_struct;
using ferry::capi::require;
using ferry::capi::write_struct;

struct ferry_channel : ferry::capi::HandleOf<ferry::capi::kChannelMagic> {
  std::unique_ptr<ferry::cuda::Channel> channel;
};

namespace {

ferry_channel_options_t to_c(const ferry::cuda::ChannelOptions& d) {
  ferry_channel_options_t o{};
  o.struct_size = sizeof o;
  o.idle_us = d.idle_us;
  o.slots = d.slots;
  o.timeout_ms = d.timeout_ms;
  o.spin_us = d.spin_us;
  o.use_gdrcopy = d.use_gdrcopy ? 1 : 0;
  return o;
}

// The caller's options over the defaults (members beyond its struct_size keep them).
ferry::cuda::ChannelOptions to_cpp(const ferry_channel_options_t* given) {
  ferry::cuda::ChannelOptions c;
  if (!given) return c;
  const ferry_channel_options_t read = read_struct(given, to_c(c), "options");
  const ferry_channel_options_t* o = &read;
  if (o->reserved != 0)
    throw ferry::InvalidArgument("options->reserved=" + std::to_string(o->reserved) + ": must be 0");
  c.idle_us = o->idle_us;
  c.slots = o->slots;
  c.timeout_ms = o->timeout_ms;
  c.spin_us = o->spin_us;
  if (o->use_gdrcopy != 0 && o->use_gdrcopy != 1)
    throw ferry::InvalidArgument("use_gdrcopy=" + std::to_string(o->use_gdrcopy) +
                                 ": expected 0 or 1");
  c.use_gdrcopy = o->use_gdrcopy == 1;
  return c;
}

}  // namespace

extern "C" {

ferry_status_t ferry_channel_options_defaults(ferry_channel_options_t* out) {
  return guarded([&] {
    require(out, "out");
    write_struct(out, to_c(ferry::cuda::ChannelOptions{}), "out");
  });
}

ferry_status_t ferry_channel_create_v2(const ferry_channel_options_t* options, int device,
                                       ferry_channel_t* out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    auto h = std::make_unique<ferry_channel>();
    h->channel = std::make_unique<ferry::cuda::Channel>(device, to_cpp(options));
    *out = h.release();
  });
}

ferry_status_t ferry_channel_create(int device, const ferry_channel_options_t* options,
                                    ferry_channel_t* out) {
  return ferry_channel_create_v2(options, device, out);
}

ferry_status_t ferry_channel_destroy(ferry_channel_t channel) {
  return guarded([&] {
    ferry::capi::destroy(channel, "channel", [](ferry_channel& h) {
      std::unique_ptr<ferry::cuda::Channel> owned = std::move(h.channel);
      owned->close();  // an error is reported; the channel is freed either way
    });
  });
}

ferry_status_t ferry_channel_write(ferry_channel_t channel, void* dev_dst, const void* src,
                                   size_t n) {
  return guarded([&] {
    live(channel, "channel");
    channel->channel->write(dev_dst, src, n);
  });
}

ferry_status_t ferry_channel_read(ferry_channel_t channel, void* dst, const void* dev_src,
                                  size_t n) {
  return guarded([&] {
    live(channel, "channel");
    channel->channel->read(dst, dev_src, n);
  });
}

ferry_status_t ferry_channel_fill(ferry_channel_t channel, void* dev_dst, int value, size_t n) {
  return guarded([&] {
    live(channel, "channel");
    channel->channel->fill(dev_dst, value, n);
  });
}

ferry_status_t ferry_channel_signal(ferry_channel_t channel, uint32_t* dev_flag, uint32_t value) {
  return guarded([&] {
    live(channel, "channel");
    channel->channel->signal(dev_flag, value);
  });
}

ferry_status_t ferry_channel_wait(ferry_channel_t channel, const uint32_t* dev_flag, uint32_t value,
                                  uint64_t timeout_us, int* reached) {
  return guarded([&] {
    live(channel, "channel");
    require(reached, "reached");
    *reached = channel->channel->wait(dev_flag, value, timeout_us) ? 1 : 0;
  });
}

ferry_status_t ferry_channel_ping(ferry_channel_t channel, double* round_trip_us) {
  return guarded([&] {
    live(channel, "channel");
    require(round_trip_us, "round_trip_us");
    *round_trip_us = channel->channel->ping();
  });
}

ferry_status_t ferry_channel_get_stats(ferry_channel_t channel, ferry_channel_stats_t* out) {
  return guarded([&] {
    live(channel, "channel");
    require(out, "out");
    ferry::capi::caller_struct_size(out, "out");  // before the work
    const ferry::cuda::ChannelStats s = channel->channel->stats();
    write_struct(out, ferry_channel_stats_t{sizeof(ferry_channel_stats_t), s.requests, s.launches, s.idle_exits,
                                            s.gdrcopy_writes},
                 "out");
  });
}

ferry_status_t ferry_gdrcopy_available(int* available, const char** reason) {
  return guarded([&] {
    require(available, "available");
    const ferry::cuda::GdrcopyStatus& s = ferry::cuda::gdrcopy_status();
    *available = s.available ? 1 : 0;
    if (reason) *reason = s.reason.c_str();
  });
}

}  // extern "C"
