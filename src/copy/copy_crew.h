// copy_crew.h — the process's one crew of copy threads, shared by the engines
// of every device (one host budget: two GPUs do not start two sets of threads
// on the same cores).
//
// Size: FERRY_COPY_WORKERS threads if set, else one per usable core, at most
// 16, counting the calling thread (so the crew has one fewer). Idle threads
// spin FERRY_COPY_SPIN_US before they sleep.
//
// After fork() the child has none of the parent's threads: its first call
// makes a new crew, and the parent's is left alone (its std::thread objects
// cannot be joined or destroyed in the child).
#pragma once

namespace ferry {

class Crew;

// Throws InvalidArgument if the FERRY_COPY_* options are bad.
Crew& copy_crew();

}  // namespace ferry
