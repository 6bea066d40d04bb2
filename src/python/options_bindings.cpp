// options_bindings.cpp — the FERRY_* options as this process read them
// (core/options.h: one table of {name, default, doc}) and the fault-injection
// switch that makes a chosen real call fail (core/fault.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "core/fault.h"
#include "core/options.h"
#include "python/args.h"
#include "python/bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

void bind_options(nb::module_& m) {
  m.def("option_table", [] {
    nb::list rows;
    for (const auto& s : ferry::option_table())
      rows.append(nb::make_tuple(s.name, s.default_value, s.doc));
    return rows;
  });
  m.def("option_text", [](const std::string& name) { return ferry::options().text(name.c_str()); }, "name"_a,
        "The value of a choice or text FERRY_* option, as this process read it (once, at first use).");
  m.def("check_options", [] { ferry::options(); },
        "Raise InvalidArgumentError if a FERRY_* variable is unknown or has a bad value.");
  m.def("set_fault_injection", [](nb::handle spec) { ferry::set_fault_injection(str_arg(spec, "spec")); },
        "spec"_a.none());
}

}  // namespace ferry::python
