// catalog_test.cpp — read_catalog on real files written by hand: columns in
// file order across files, absolute offsets, shapes; a tensor in two files,
// an index that contradicts the headers, a damaged header: errors naming the
// files and the tensor.
#include "load/catalog.h"

#include <gtest/gtest.h>

#include <functional>
#include <random>

#include "core/error.h"
#include "../support/temp_files.h"

namespace ferry::load {
namespace {

// A safetensors file of U8 tensors [(name, bytes)], packed in order.
std::vector<uint8_t> file_of(const std::vector<std::pair<std::string, uint64_t>>& tensors, std::string* header_out = nullptr) {
  std::string h = "{";
  uint64_t at = 0;
  for (const auto& [name, n] : tensors) {
    if (h.size() > 1) h += ",";
    h += "\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(n) + "],\"data_offsets\":[" +
         std::to_string(at) + "," + std::to_string(at + n) + "]}";
    at += n;
  }
  h += "}";
  while ((8 + h.size()) % 8) h += " ";
  std::vector<uint8_t> f(8);
  for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<uint8_t>(h.size() >> (8 * i));
  f.insert(f.end(), h.begin(), h.end());
  f.resize(f.size() + at, 0x5A);
  if (header_out) *header_out = h;
  return f;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Catalog, ColumnsInFileOrderAcrossFiles) {
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  std::mt19937_64 rng(11);
  std::vector<std::string> files;
  std::vector<std::vector<std::pair<std::string, uint64_t>>> want(3);
  std::vector<uint64_t> data_offset;
  for (int f = 0; f < 3; ++f) {
    for (int k = 0; k < 700; ++k) want[f].push_back({"f" + std::to_string(f) + ".t" + std::to_string(k), 1 + rng() % 300});
    std::string h;
    files.push_back(dir.add(file_of(want[f], &h), "m-" + std::to_string(f) + ".safetensors"));
    data_offset.push_back(8 + h.size());
  }
  Catalog c = read_catalog(files, {}, {});
  ASSERT_EQ(c.size(), 2100u);
  ASSERT_EQ(c.shape_at.size(), 2101u);
  size_t i = 0;
  for (uint32_t f = 0; f < 3; ++f) {
    uint64_t at = data_offset[f];
    for (const auto& [name, n] : want[f]) {
      EXPECT_EQ(c.names[i], name);
      EXPECT_EQ(c.file[i], f);
      EXPECT_EQ(c.dtype[i], Dtype::U8);
      EXPECT_EQ(c.offset[i], at);
      EXPECT_EQ(c.bytes[i], n);
      ASSERT_EQ(c.shape_at[i + 1] - c.shape_at[i], 1u);
      EXPECT_EQ(c.shape[c.shape_at[i]], n);
      at += n;
      ++i;
    }
  }
  // An index that agrees: accepted.
  std::vector<std::string> names{"f2.t5", "f0.t0"};
  std::vector<uint32_t> in{2, 0};
  EXPECT_EQ(read_catalog(files, names, in).size(), 2100u);
}

TEST(Catalog, RefusesDuplicatesContradictingIndexesAndDamage) {
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  std::string a = dir.add(file_of({{"x", 3}, {"y", 5}}), "a.safetensors");
  std::string b = dir.add(file_of({{"z", 2}, {"x", 1}}), "b.safetensors");
  std::vector<std::string> both{a, b};
  EXPECT_NE(what_of([&] { read_catalog(both, {}, {}); }).find("tensor 'x' is in two files: " + a + " and " + b),
            std::string::npos);
  std::vector<std::string> one{a};
  std::vector<std::string> t{"y"};
  std::vector<uint32_t> other{0};
  std::string two_files = dir.add(file_of({{"w", 1}}), "c.safetensors");
  std::vector<std::string> ac{a, two_files};
  std::vector<uint32_t> in_c{1};
  EXPECT_NE(what_of([&] { read_catalog(ac, t, in_c); }).find("maps tensor 'y' to " + two_files + ", but it is in " + a),
            std::string::npos);
  std::vector<std::string> none{"nope"};
  EXPECT_NE(what_of([&] { read_catalog(one, none, other); }).find("maps tensor 'nope' to " + a + ", but no file has it"),
            std::string::npos);
  std::vector<uint32_t> past{5};
  EXPECT_NE(what_of([&] { read_catalog(one, t, past); }).find("names file 5 of 1"), std::string::npos);
  std::vector<uint32_t> two_ix{0, 0};
  EXPECT_THROW(read_catalog(one, t, two_ix), InvalidArgument);
  std::vector<uint8_t> cut = file_of({{"q", 9}});
  cut.resize(cut.size() - 1);
  std::vector<std::string> damaged{a, dir.add(cut, "cut.safetensors")};
  EXPECT_NE(what_of([&] { read_catalog(damaged, {}, {}); }).find("cut.safetensors: tensor 'q'"), std::string::npos);
  // Headers are read by several threads: the error reported is the first file's in order.
  std::vector<std::string> many{a, b, dir.dir() + "/missing-1.safetensors"};
  for (int k = 0; k < 20; ++k) many.push_back(damaged[1]);
  many.push_back(dir.dir() + "/missing-2.safetensors");
  for (int round = 0; round < 5; ++round)
    EXPECT_NE(what_of([&] { read_catalog(many, {}, {}); }).find("missing-1.safetensors"), std::string::npos);
  std::vector<std::string> missing{dir.dir() + "/missing.safetensors"};
  EXPECT_THROW(read_catalog(missing, {}, {}), OsError);
}

}  // namespace
}  // namespace ferry::load
