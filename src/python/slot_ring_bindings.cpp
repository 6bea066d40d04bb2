// slot_ring_bindings.cpp — core/slot_ring.h for rings kept in Python. Its
// first user, save's ring, now runs in C++ (load/write_pipeline.h); the
// Python rings still to become instances (torch/data/slots.py) would use it.
// take() may block until a slot comes back: it releases the GIL then.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>

#include "core/slot_ring.h"
#include "python/gil.h"

namespace nb = nanobind;

namespace ferry::python {

void bind_slot_ring(nb::module_& m) {
  nb::class_<SlotRing>(m, "SlotRing")
      .def(nb::init<size_t>())
      .def("take",
           [](SlotRing& r) {
             SlotRing::Taken t;
             {
               GilRelease unlocked;
               t = r.take();
             }
             return std::make_pair(t.slot == SlotRing::kStopped ? -1 : static_cast<long long>(t.slot),
                                   t.landing_pending);
           })
      .def("hand_off", &SlotRing::hand_off)
      .def("give_back", &SlotRing::give_back)
      .def("stop", &SlotRing::stop)
      .def("state", [](const SlotRing& r, size_t s) {
        switch (r.state(s)) {
          case SlotState::free: return "free";
          case SlotState::filling: return "filling";
          case SlotState::in_flight: return "in flight";
        }
        return "?";
      })
      .def("__len__", &SlotRing::size);
}

}  // namespace ferry::python
