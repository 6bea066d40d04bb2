// sysfs_bindings.cpp — src/os/sysfs.h's pure parsers for python/ferry: the one
// cpulist and THP-setting grammar (the doctor's facts parse with these, not a
// copy of their own). Text comes as UTF-8 bytes: any Python str can be passed
// (ferry/facts/parsers encodes with surrogatepass), and a non-ASCII byte is
// simply not part of either grammar.

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <string_view>
#include <vector>

#include "os/sysfs.h"
#include "python/bindings.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ferry::python {

namespace {

std::string_view view_of(const nb::bytes& text) { return {text.c_str(), text.size()}; }

}  // namespace

void bind_sysfs(nb::module_& m) {
  m.attr("MAX_CPU_ID") = os::kMaxCpuId;
  m.def(
      "parse_cpulist",
      [](nb::bytes text) -> nb::object {
        std::vector<int> ids;
        if (!os::parse_cpulist(view_of(text), &ids)) return nb::none();
        return nb::cast(ids);
      },
      "text"_a,
      "A Linux cpulist (b\"0-3,8\", the stride form b\"0-31:2/4\") as sorted distinct ids; blank is []; "
      "None for anything else, an id above MAX_CPU_ID or more than 2**17 ids (src/os/sysfs.h).");
  m.def(
      "parse_thp_setting",
      [](nb::bytes text) {
        const std::string value = os::parse_thp_setting(view_of(text));
        return nb::bytes(value.data(), value.size());  // bytes back: the caller decodes as it encoded
      },
      "text"_a,
      "The selected value of a THP setting (b\"always [madvise] never\" -> b\"madvise\"; one bare word is "
      "that word); b\"\" when blank or garbled (src/os/sysfs.h).");
}

}  // namespace ferry::python
