// safetensors_test.cpp — the safetensors header parser on files written by
// hand: every dtype, scalars, empty tensors, metadata, padding; table-driven,
// every damaged header field gives an InvalidArgument naming the file and the
// tensor; random damage and every truncation never crash it. Shard indexes.
// read_safetensors_header on real files.
#include "load/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>

#include "core/error.h"
#include "../support/temp_files.h"

namespace ferry::load {
namespace {

// An 8-byte little-endian length, the header, then data_bytes bytes.
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes, uint64_t length_field = UINT64_MAX) {
  uint64_t n = length_field == UINT64_MAX ? header.size() : length_field;
  std::vector<uint8_t> f(8);
  for (int i = 0; i < 8; ++i) f[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  f.insert(f.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) f.push_back(static_cast<uint8_t>(i * 7));
  return f;
}

SafetensorsHeader parse(const std::vector<uint8_t>& f, const char* name = "m.safetensors") {
  return parse_safetensors_header(f, f.size(), name);
}

std::string error_of(const std::vector<uint8_t>& f, const char* name = "m.safetensors") {
  try {
    parse(f, name);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

std::string entry(const char* name, const char* dtype, const char* shape, uint64_t b, uint64_t e) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

TEST(Safetensors, EveryDtypeHasItsSize) {
  struct {
    const char* name;
    unsigned bits;
  } expected[] = {{"BOOL", 8},        {"F4", 4},          {"F6_E2M3", 6},  {"F6_E3M2", 6}, {"U8", 8},
                  {"I8", 8},          {"F8_E5M2", 8},     {"F8_E4M3", 8},  {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
                  {"F8_E5M2FNUZ", 8}, {"I16", 16},        {"U16", 16},     {"F16", 16},    {"BF16", 16},
                  {"I32", 32},        {"U32", 32},        {"F32", 32},     {"C64", 64},    {"F64", 64},
                  {"I64", 64},        {"U64", 64}};
  ASSERT_EQ(std::size(expected), static_cast<size_t>(Dtype::count_));
  // One file holding a [2, 4] tensor of every dtype, in file order.
  std::string h = "{";
  uint64_t off = 0;
  for (const auto& d : expected) {
    auto parsed = parse_dtype(d.name);
    ASSERT_TRUE(parsed) << d.name;
    EXPECT_EQ(dtype_bits(*parsed), d.bits) << d.name;
    EXPECT_STREQ(dtype_name(*parsed), d.name);
    uint64_t bytes = 8 * d.bits / 8;
    h += (off ? "," : "") + entry((std::string("t_") + d.name).c_str(), d.name, "[2,4]", off, off + bytes);
    off += bytes;
  }
  h += "}";
  SafetensorsHeader sh = parse(make_file(h, off));
  ASSERT_EQ(sh.tensors.size(), std::size(expected));
  for (size_t i = 0; i < sh.tensors.size(); ++i) {
    EXPECT_EQ(sh.tensors[i].name, std::string("t_") + expected[i].name);
    EXPECT_EQ(dtype_bits(sh.tensors[i].dtype), expected[i].bits);
    EXPECT_EQ(sh.tensors[i].shape, (std::vector<uint64_t>{2, 4}));
  }
  EXPECT_FALSE(parse_dtype("bf16"));  // names are case-sensitive, as in safetensors
  EXPECT_FALSE(parse_dtype("F8_E4M3FN"));
}

TEST(Safetensors, ScalarsEmptyTensorsMetadataPaddingAndOrder) {
  // Entries out of file order, empty tensors sharing an offset, a scalar, an
  // escaped name, metadata, and the spaces safetensors pads the header with.
  std::string h = "{" + entry("z", "F32", "[3]", 8, 20) + "," + entry("empty2", "BF16", "[0,7]", 8, 8) + "," +
                  "\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\\u00e9\"}," + entry("s", "I64", "[]", 0, 8) +
                  "," + entry("empty1", "U8", "[5,0]", 8, 8) + "," + entry("n\\u00e9", "F4", "[6]", 20, 23) + "}";
  while ((8 + h.size()) % 8) h += ' ';
  SafetensorsHeader sh = parse(make_file(h, 23));
  EXPECT_EQ(sh.header_bytes, h.size());
  EXPECT_EQ(sh.data_offset, 8 + h.size());
  ASSERT_EQ(sh.tensors.size(), 5u);
  const char* order[] = {"s", "empty1", "empty2", "z", "n\u00e9"};
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(sh.tensors[i].name, order[i]);
  EXPECT_TRUE(sh.tensors[0].shape.empty());
  EXPECT_EQ(sh.tensors[3].begin, 8u);
  EXPECT_EQ(sh.tensors[3].end, 20u);
  ASSERT_TRUE(sh.has_metadata);
  ASSERT_EQ(sh.metadata_keys.size(), 2u);
  ASSERT_EQ(sh.metadata_values.size(), 2u);
  EXPECT_EQ(sh.metadata_keys[0], "format");
  EXPECT_EQ(sh.metadata_values[0], "pt");
  EXPECT_EQ(sh.metadata_keys[1], "note");
  EXPECT_EQ(sh.metadata_values[1], "caf\u00e9");
  EXPECT_EQ(sh.find("z")->dtype, Dtype::F32);
  EXPECT_EQ(sh.find("nope"), nullptr);
}

TEST(Safetensors, EmptyFileOfTensors) {
  SafetensorsHeader sh = parse(make_file("{}", 0));
  EXPECT_TRUE(sh.tensors.empty());
  EXPECT_FALSE(sh.has_metadata);
  sh = parse(make_file("{\"__metadata__\":{}}  ", 0));
  EXPECT_TRUE(sh.has_metadata);
}

TEST(Safetensors, UnknownTensorFieldsAreIgnoredAsSafetensorsDoes) {
  std::string h = "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2],\"extra\":[1,{\"x\":null}]}}";
  EXPECT_EQ(parse(make_file(h, 2)).tensors.size(), 1u);
}

struct Damaged {
  const char* what;
  std::vector<uint8_t> file;
  std::vector<const char*> expect;  // substrings of the message
};

std::vector<Damaged> damaged_files() {
  const std::string a8 = entry("a", "F32", "[2]", 0, 8);
  return {
      {"empty file", {}, {"m.safetensors: truncated: 0 bytes"}},
      {"5 bytes", {1, 0, 0, 0, 0}, {"truncated: 5 bytes"}},
      {"length past the end", make_file("{}", 0, 1000), {"header length 1000 runs past the end of the file (10 bytes)"}},
      {"length over the limit", make_file("{}", 0, 100000001), {"larger than safetensors' limit"}},
      {"length 2^64-1", make_file("{}", 0, UINT64_MAX - 1), {"larger than safetensors' limit"}},
      {"zero-length header", make_file("", 4, 0), {"header: invalid JSON at byte 0"}},
      {"not JSON", make_file("{\"a\":", 0), {"header: invalid JSON"}},
      {"not an object", make_file("[1,2]", 0), {"header: expected a JSON object, found an array"}},
      {"invalid UTF-8 name", make_file("{\"\xff\":1}", 0), {"invalid UTF-8"}},
      {"duplicate tensor", make_file("{" + a8 + "," + a8 + "}", 8), {"duplicate key 'a'"}},
      {"entry not an object", make_file("{\"a\":5}", 0), {"tensor 'a': expected an object, found a number"}},
      {"missing dtype", make_file("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1), {"tensor 'a': missing \"dtype\""}},
      {"missing shape", make_file("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1), {"tensor 'a': missing \"shape\""}},
      {"missing offsets", make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1), {"tensor 'a': missing \"data_offsets\""}},
      {"dtype not a string", make_file("{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
       {"tensor 'a': \"dtype\": expected a string, found a number"}},
      {"unknown dtype", make_file("{" + entry("w.0", "F12", "[1]", 0, 1) + "}", 1),
       {"tensor 'w.0': unknown dtype 'F12' (known: BOOL, F4,"}},
      {"lowercase dtype", make_file("{" + entry("a", "bf16", "[1]", 0, 2) + "}", 2), {"unknown dtype 'bf16'"}},
      {"shape not an array", make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", 1),
       {"tensor 'a': \"shape\": expected an array, found a number"}},
      {"negative dim", make_file("{" + entry("a", "U8", "[-1]", 0, 1) + "}", 1),
       {"tensor 'a': shape: expected unsigned integers below 2^64, found -1"}},
      {"fractional dim", make_file("{" + entry("a", "U8", "[1.5]", 0, 1) + "}", 1), {"shape: expected unsigned", "1.5"}},
      {"string dim", make_file("{" + entry("a", "U8", "[\"2\"]", 0, 2) + "}", 2), {"found a string"}},
      {"dim past 2^64", make_file("{" + entry("a", "U8", "[18446744073709551616]", 0, 1) + "}", 1),
       {"below 2^64, found 18446744073709551616"}},
      {"element count overflow", make_file("{" + entry("a", "U8", "[4294967296,4294967296]", 0, 1) + "}", 1),
       {"tensor 'a': shape [4294967296, 4294967296]: element count overflows 64 bits"}},
      {"bit count overflow", make_file("{" + entry("a", "F64", "[4611686018427387904]", 0, 1) + "}", 1),
       {"size in bits overflows"}},
      {"offsets not an array", make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":{}}}", 1),
       {"\"data_offsets\": expected an array, found an object"}},
      {"one offset", make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1),
       {"expected [begin, end], found 1 values"}},
      {"three offsets", make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2),
       {"found 3 values"}},
      {"negative offset", make_file("{" + entry("a", "U8", "[1]", 0, 1).replace(entry("a", "U8", "[1]", 0, 1).find("[0,"), 3, "[-0,") + "}", 1),
       {"data_offsets: expected unsigned integers"}},
      {"end before begin", make_file("{" + entry("a", "U8", "[0]", 5, 4) + "}", 5), {"tensor 'a': data_offsets [5, 4]: end before begin"}},
      {"size mismatch", make_file("{" + entry("a", "F32", "[2]", 0, 6) + "}", 6),
       {"tensor 'a': shape [2] of F32 is 8 bytes but data_offsets [0, 6] hold 6"}},
      {"scalar size mismatch", make_file("{" + entry("a", "F64", "[]", 0, 4) + "}", 4), {"shape [] of F64 is 8 bytes"}},
      {"F4 half byte", make_file("{" + entry("a", "F4", "[3]", 0, 2) + "}", 2),
       {"tensor 'a': shape [3] of F4 is 12 bits, not a whole number of bytes"}},
      {"F6 partial byte", make_file("{" + entry("a", "F6_E3M2", "[2]", 0, 2) + "}", 2), {"12 bits"}},
      {"offsets past the end", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "}", 4),
       {"tensor 'a': data_offsets [0, 8] run past the end of the file (the data section holds 4 bytes)"}},
      {"huge offsets", make_file("{" + entry("a", "U8", "[1]", 18446744073709551614ull, 18446744073709551615ull) + "}", 1),
       {"run past the end of the file"}},
      {"overlap", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}", 12),
       {"tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"}},
      {"same range twice", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 0, 8) + "}", 8),
       {"tensor 'b': data_offsets [0, 8] overlap tensor 'a'"}},
      {"empty tensor inside another", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("e", "F32", "[0]", 4, 4) + "}", 8),
       {"tensor 'e': data_offsets [4, 4] overlap tensor 'a'"}},
      {"gap", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 12, 20) + "}", 20),
       {"tensor 'b': data_offsets [12, 20] leave a gap of 4 bytes after tensor 'a'"}},
      {"gap at the start", make_file("{" + entry("a", "F32", "[2]", 4, 12) + "}", 12), {"leave a gap of 4 bytes after the header"}},
      {"trailing bytes", make_file("{" + entry("a", "F32", "[2]", 0, 8) + "}", 11),
       {"the data section holds 11 bytes but the tensors end at 8 (last: tensor 'a'): the file has 3 bytes no tensor describes"}},
      {"data without tensors", make_file("{}", 3), {"(no tensors)"}},
      {"metadata not an object", make_file("{\"__metadata__\":[]}", 0), {"\"__metadata__\": expected an object of strings, found an array"}},
      {"metadata value not a string", make_file("{\"__metadata__\":{\"step\":5}}", 0), {"\"__metadata__\" 'step': expected a string, found a number"}},
      {"metadata twice", make_file("{\"__metadata__\":{},\"__metadata__\":{\"a\":\"b\"}}", 0),
       {"header: invalid JSON at byte 19: duplicate key '__metadata__'"}},
      {"a field twice", make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"shape\":[2],\"data_offsets\":[0,1]}}", 1),
       {"duplicate key 'shape'"}},
      {"deep nesting", make_file("{\"a\":{\"x\":" + std::string(70, '[') + std::string(70, ']') + "}}", 0), {"nested deeper"}},
  };
}

TEST(Safetensors, EveryDamagedFieldIsAnErrorNamingFileAndTensor) {
  for (const Damaged& d : damaged_files()) {
    std::string msg = error_of(d.file);
    EXPECT_EQ(msg.rfind("m.safetensors: ", 0), 0u) << d.what << ": " << msg;
    for (const char* e : d.expect) EXPECT_NE(msg.find(e), std::string::npos) << d.what << ": " << msg;
    // The non-throwing entry point agrees.
    SafetensorsHeader out;
    std::string err;
    EXPECT_EQ(parse_safetensors_header(d.file.data(), d.file.size(), &out, &err), FERRY_ERROR_INVALID_ARGUMENT)
        << d.what;
    EXPECT_FALSE(err.empty()) << d.what;
  }
}

TEST(Safetensors, EveryTruncationAndRandomDamageIsAnErrorNotACrash) {
  std::string h = "{\"__metadata__\":{\"format\":\"pt\"}," + entry("a", "BF16", "[3,5]", 0, 30) + "," +
                  entry("b", "F8_E4M3", "[7]", 30, 37) + "," + entry("c", "I64", "[]", 37, 45) + "}";
  std::vector<uint8_t> good = make_file(h, 45);
  ASSERT_EQ(parse_safetensors_header(good.data(), good.size(), nullptr, nullptr), 0);
  for (size_t n = 0; n < good.size(); ++n)  // a short file: some check must catch it
    EXPECT_EQ(parse_safetensors_header(good.data(), n, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT) << n;
  std::mt19937_64 rng(11);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> f = good;
    for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) f[rng() % (8 + h.size())] = static_cast<uint8_t>(rng());
    SafetensorsHeader out;
    if (parse_safetensors_header(f.data(), f.size(), &out, nullptr) == 0) {
      ++accepted;  // a harmless edit (a name's letter): the result still tiles the file
      uint64_t end = 0;
      for (const auto& t : out.tensors) {
        EXPECT_EQ(t.begin, end);
        end = t.end;
      }
      EXPECT_EQ(out.data_offset + end, f.size());
    }
  }
  EXPECT_GT(accepted, 0);
}

TEST(Safetensors, HeaderLengthAlone) {
  auto f = make_file("{}", 0);
  EXPECT_EQ(safetensors_header_length(f, f.size(), "x"), 2u);
  EXPECT_THROW(safetensors_header_length(std::span<const uint8_t>(f.data(), 7), f.size(), "x"), InvalidArgument);
}

TEST(Safetensors, ReadsARealFile) {
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  std::string h = "{" + entry("w", "BF16", "[2,3]", 0, 12) + "}";
  std::string p = dir.add(make_file(h, 12), "ok.safetensors");
  SafetensorsHeader sh = read_safetensors_header(p);
  ASSERT_EQ(sh.tensors.size(), 1u);
  EXPECT_EQ(sh.file_bytes, 8 + h.size() + 12);
  // A file cut inside its data: the message names the path and the tensor.
  std::vector<uint8_t> cut = make_file(h, 12);
  cut.resize(cut.size() - 5);
  std::string pc = dir.add(cut, "cut.safetensors");
  try {
    read_safetensors_header(pc);
    ADD_FAILURE() << "no error for a cut file";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(pc + ": tensor 'w': data_offsets [0, 12] run past the end"), std::string::npos)
        << e.what();
  }
  std::vector<uint8_t> head = make_file(h, 12);
  head.resize(20);
  std::string ph = dir.add(head, "cuthead.safetensors");
  EXPECT_THROW(read_safetensors_header(ph), InvalidArgument);
  try {
    read_safetensors_header(dir.dir() + "/missing.safetensors");
    ADD_FAILURE();
  } catch (const OsError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos);
    EXPECT_EQ(e.error_number(), ENOENT);
  }
  EXPECT_THROW(read_safetensors_header(dir.dir()), InvalidArgument);  // a directory: not a regular file
}

// Issue 21, item 4: a FIFO among a checkpoint's files hung the load in open().
TEST(Safetensors, AFifoIsRefusedAtOnceNotWaitedOn) {
  test_support::TempFiles dir;
  ASSERT_TRUE(dir.ok());
  const std::string fifo = dir.dir() + "/model.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    read_safetensors_header(fifo);
    ADD_FAILURE() << "a FIFO was read";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fifo + ": not a regular file"), std::string::npos) << e.what();
  }
}

// Issue 21, item 7: a 99 MB number in data_offsets made a 99 MB message.
TEST(Safetensors, AHugeNumberIsQuotedCutShort) {
  const std::string digits(1'000'000, '9');
  const std::string h = "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0," + digits + "]}}";
  const std::string e = error_of(make_file(h, 1));
  EXPECT_NE(e.find("data_offsets"), std::string::npos) << e.substr(0, 300);
  EXPECT_LT(e.size(), 400u) << e.substr(0, 300);
}

std::vector<std::string> strings(const StringList& list) { return {list.begin(), list.end()}; }

TEST(ShardIndex, ParsesTheWeightMap) {
  ShardIndex idx = parse_shard_index(
      "{\"metadata\":{\"total_size\":123},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
      "\"b\":\"model-00002-of-00002.safetensors\",\"c\":\"model-00001-of-00002.safetensors\","
      "\"d\":\"sub/x.safetensors\"}}",
      "model.safetensors.index.json");
  EXPECT_EQ(strings(idx.tensors), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(strings(idx.shards), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                           "model-00002-of-00002.safetensors", "sub/x.safetensors"}));
  EXPECT_EQ(idx.shard_of, (std::vector<uint32_t>{0, 1, 0, 2}));
}

// Random maps over a few shards: shards in first-seen order, each entry's
// shard_of pointing at its own file.
TEST(ShardIndex, NumbersTheShardsInFirstSeenOrder) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 200; ++round) {
    const size_t n = rng() % 300, pool = 1 + rng() % 20;
    std::string text = "{\"metadata\":{\"total_size\":1},\"weight_map\":{";
    std::vector<std::string> files, first_seen;
    for (size_t k = 0; k < n; ++k) {
      std::string file = "model-" + std::to_string(rng() % pool) + ".safetensors";
      if (std::find(first_seen.begin(), first_seen.end(), file) == first_seen.end()) first_seen.push_back(file);
      files.push_back(file);
      text += (k ? ",\"t" : "\"t") + std::to_string(k) + "\":\"" + file + "\"";
    }
    ShardIndex idx = parse_shard_index(text + "}}", "i.json");
    ASSERT_EQ(idx.tensors.size(), n);
    ASSERT_EQ(idx.shard_of.size(), n);
    EXPECT_EQ(strings(idx.shards), first_seen);
    for (size_t k = 0; k < n; ++k) {
      EXPECT_EQ(idx.tensors[k], "t" + std::to_string(k));
      ASSERT_LT(idx.shard_of[k], idx.shards.size());
      EXPECT_EQ(idx.shards[idx.shard_of[k]], files[k]);
    }
  }
}

TEST(ShardIndex, RefusesDamagedIndexes) {
  struct {
    const char* json;
    const char* expect;
  } cases[] = {
      {"", "invalid JSON"},
      {"[]", "expected a JSON object, found an array"},
      {"{\"metadata\":{}}", "no \"weight_map\""},
      {"{\"weight_map\":[]}", "\"weight_map\": expected an object"},
      {"{\"weight_map\":{\"a\":1}}", "tensor 'a': expected a file name, found a number"},
      {"{\"weight_map\":{\"a\":\"\"}}", "tensor 'a': empty file name"},
      {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "absolute path '/etc/passwd'"},
      {"{\"weight_map\":{\"a\":\"../x.safetensors\"}}", "leaves the index's directory"},
      {"{\"weight_map\":{\"a\":\"d/../../x\"}}", "leaves the index's directory"},
      {"{\"weight_map\":{\"a\":\"x\\u0000y\"}}", "NUL byte"},
      {"{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", "duplicate key 'a'"},
      {"{\"weight_map\":{},\"weight_map\":{\"a\":\"y\"}}", "invalid JSON at byte 17: duplicate key 'weight_map'"},
      {"{\"weight_map\":{\"a\":\"x\"},\"metadata\":{\"n\":1,\"n\":2}}", "duplicate key 'n'"},
      {"{\"weight_map\":{\"a\":\"x\"}} x", "unexpected 'x' after the value"},
  };
  for (const auto& c : cases) {
    try {
      parse_shard_index(c.json, "i.json");
      ADD_FAILURE() << "accepted: " << c.json;
    } catch (const InvalidArgument& e) {
      std::string m = e.what();
      EXPECT_EQ(m.rfind("i.json: ", 0), 0u) << m;
      EXPECT_NE(m.find(c.expect), std::string::npos) << c.json << " -> " << m;
    }
  }
  EXPECT_NO_THROW(parse_shard_index("{\"weight_map\":{\"a\":\"..x/y..\"}}", "i.json"));  // dots, not '..'
}

}  // namespace
}  // namespace ferry::load
