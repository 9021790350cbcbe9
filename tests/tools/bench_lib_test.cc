// Unit tests of tools/bench_lib: ote_bench's option parsing and validation, size and
// duration parsing, percentiles, the JSON and table line formats, the --check pattern and
// the initiator/target control messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "tools/bench_lib.h"
}

namespace {

using ote_test::OteTest;

class BenchLibTest : public OteTest {};

// Parses a command line given as words (the program name is added). Returns what
// bench_options_parse returns; the error text lands in err_.
class BenchOptionsTest : public OteTest {
  protected:
    int Parse(std::vector<std::string> words) {
        words.insert(words.begin(), "ote_bench");
        storage_ = words;
        std::vector<char *> argv;
        for (auto &w : storage_) argv.push_back(&w[0]);
        argv.push_back(nullptr);
        err_[0] = '\0';
        return bench_options_parse(static_cast<int>(storage_.size()), argv.data(), &o_, err_,
                                   sizeof err_);
    }
    // Expects a parse error whose message contains needle.
    void ExpectError(std::vector<std::string> words, const std::string &needle) {
        std::string line;
        for (auto &w : words) line += w + " ";
        EXPECT_EQ(Parse(words), -1) << line;
        EXPECT_NE(std::string(err_).find(needle), std::string::npos)
            << line << "-> '" << err_ << "' lacks '" << needle << "'";
    }
    bench_options_t o_;
    char err_[512];
    std::vector<std::string> storage_;
};

TEST_F(BenchLibTest, ParseSizeAcceptsBinarySuffixes) {
    struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"0", 0},           {"4096", 4096},       {"4096B", 4096},
        {"4K", 4096},       {"4k", 4096},         {"4KB", 4096},
        {"4KiB", 4096},     {"64M", 64ull << 20}, {"64mib", 64ull << 20},
        {"1G", 1ull << 30}, {"2T", 2ull << 40},   {"18446744073709551615", UINT64_MAX},
    };
    for (auto &c : ok) {
        uint64_t v = 12345;
        EXPECT_EQ(bench_parse_size(c.s, &v), 0) << c.s;
        EXPECT_EQ(v, c.v) << c.s;
    }
    const char *bad[] = {"",
                         "K",
                         "-1",
                         "+4",
                         " 4",
                         "4 ",
                         "4X",
                         "4KK",
                         "4.5K",
                         "0x10",
                         "4Ki",
                         "4KiBB",
                         "18446744073709551616",
                         "16777216T"};
    for (const char *s : bad) {
        uint64_t v = 777;
        EXPECT_EQ(bench_parse_size(s, &v), -1) << s;
        EXPECT_EQ(v, 777u) << "output written on failure for " << s;
    }
    uint64_t v;
    EXPECT_EQ(bench_parse_size(nullptr, &v), -1);
}

TEST_F(BenchLibTest, ParseDuration) {
    struct {
        const char *s;
        uint64_t ns;
    } ok[] = {
        {"2", 2000000000ull},     {"2s", 2000000000ull}, {"1.5s", 1500000000ull},
        {"500ms", 500000000ull},  {"250us", 250000ull},  {"2m", 120000000000ull},
        {"1h", 3600000000000ull}, {".5", 500000000ull},  {"7ns", 7},
    };
    for (auto &c : ok) {
        uint64_t ns = 0;
        EXPECT_EQ(bench_parse_duration(c.s, &ns), 0) << c.s;
        EXPECT_EQ(ns, c.ns) << c.s;
    }
    for (const char *s : {"", "-1", "s", "2x", "2 s", "nan", "inf", "1e30h"}) {
        uint64_t ns = 9;
        EXPECT_EQ(bench_parse_duration(s, &ns), -1) << s;
        EXPECT_EQ(ns, 9u) << s;
    }
}

TEST_F(BenchLibTest, SplitHostPort) {
    char host[64];
    uint16_t port = 0;
    ASSERT_EQ(bench_split_hostport("127.0.0.1:8080", host, sizeof host, &port), 0);
    EXPECT_STREQ(host, "127.0.0.1");
    EXPECT_EQ(port, 8080);
    ASSERT_EQ(bench_split_hostport("[::1]:0", host, sizeof host, &port), 0);
    EXPECT_STREQ(host, "::1");
    EXPECT_EQ(port, 0);
    ASSERT_EQ(bench_split_hostport("node-7.example:65535", host, sizeof host, &port), 0);
    EXPECT_STREQ(host, "node-7.example");
    EXPECT_EQ(port, 65535);
    for (const char *s : {"", "host", "host:", ":80", "host:65536", "host:-1", "::1:80", "[::1]80",
                          "[::1]", "[]:80", "host:80x"})
        EXPECT_EQ(bench_split_hostport(s, host, sizeof host, &port), -1) << s;
    char tiny[4];
    EXPECT_EQ(bench_split_hostport("longhost:1", tiny, sizeof tiny, &port), -1);
}

TEST_F(BenchLibTest, FormatSizeIsExactAndShort) {
    char b[32];
    EXPECT_STREQ(bench_format_size(0, b, sizeof b), "0");
    EXPECT_STREQ(bench_format_size(1, b, sizeof b), "1");
    EXPECT_STREQ(bench_format_size(4096, b, sizeof b), "4K");
    EXPECT_STREQ(bench_format_size(4097, b, sizeof b), "4097");
    EXPECT_STREQ(bench_format_size(1536, b, sizeof b), "1536");
    EXPECT_STREQ(bench_format_size(64ull << 20, b, sizeof b), "64M");
    EXPECT_STREQ(bench_format_size(3ull << 30, b, sizeof b), "3G");
    EXPECT_STREQ(bench_format_size(1ull << 50, b, sizeof b), "1024T");
    // What it prints, the size parser reads back.
    for (uint64_t v : {1ull, 4095ull, 4096ull, 1ull << 20, (1ull << 20) + 1, 5ull << 40}) {
        uint64_t back = 0;
        ASSERT_EQ(bench_parse_size(bench_format_size(v, b, sizeof b), &back), 0) << b;
        EXPECT_EQ(back, v);
    }
}

TEST_F(BenchOptionsTest, DefaultsWithNoArguments) {
    ASSERT_EQ(Parse({}), 0) << err_;
    EXPECT_EQ(o_.role, BENCH_ROLE_INITIATOR);
    EXPECT_STREQ(o_.transport, "shm,tcp"); // the library's default transports
    EXPECT_EQ(o_.op, BENCH_OP_WRITE);
    ASSERT_EQ(o_.n_block_sizes, 4u);
    EXPECT_EQ(o_.block_sizes[0], 4096u);
    EXPECT_EQ(o_.block_sizes[3], 16ull << 20);
    ASSERT_EQ(o_.n_batch_sizes, 1u);
    EXPECT_EQ(o_.batch_sizes[0], 16u);
    ASSERT_EQ(o_.n_threads, 1u);
    EXPECT_EQ(o_.threads[0], 1u);
    EXPECT_EQ(o_.depth, 1u);
    EXPECT_EQ(o_.duration_ns, 2000000000ull);
    EXPECT_EQ(o_.total_bytes, 0u);
    EXPECT_FALSE(o_.check);
    EXPECT_FALSE(o_.json);
    EXPECT_TRUE(o_.progress);
    EXPECT_STREQ(o_.target, "");
    EXPECT_EQ(o_.report_fd, -1);
    EXPECT_EQ(bench_working_set(&o_), 16ull * (16ull << 20));
}

TEST_F(BenchOptionsTest, FullInitiatorCommandLine) {
    ASSERT_EQ(Parse({"--transport",
                     "tcp",
                     "--op",
                     "read",
                     "-b",
                     "4K,64M,4097",
                     "--batch-size=64",
                     "-t",
                     "1,2",
                     "-n",
                     "64M",
                     "--check",
                     "--json",
                     "--warmup",
                     "0",
                     "--timeout",
                     "5s",
                     "--no-progress",
                     "--target",
                     "[::1]:7000",
                     "--listen",
                     "[::1]:0",
                     "--remote-addr",
                     "0x7f0000001000",
                     "--remote-len",
                     "8G"}),
              0)
        << err_;
    EXPECT_EQ(o_.op, BENCH_OP_READ);
    ASSERT_EQ(o_.n_block_sizes, 3u);
    EXPECT_EQ(o_.block_sizes[0], 4096u);
    EXPECT_EQ(o_.block_sizes[1], 64ull << 20);
    EXPECT_EQ(o_.block_sizes[2], 4097u);
    ASSERT_EQ(o_.n_batch_sizes, 1u);
    EXPECT_EQ(o_.batch_sizes[0], 64u);
    ASSERT_EQ(o_.n_threads, 2u);
    EXPECT_EQ(o_.threads[1], 2u);
    EXPECT_EQ(o_.total_bytes, 64ull << 20);
    EXPECT_EQ(o_.duration_ns, 0u) << "--total-bytes replaces the default duration";
    EXPECT_TRUE(o_.check);
    EXPECT_TRUE(o_.json);
    EXPECT_FALSE(o_.progress);
    EXPECT_EQ(o_.warmup_batches, 0u);
    EXPECT_EQ(o_.timeout_ns, 5000000000ull);
    EXPECT_STREQ(o_.target, "[::1]:7000");
    EXPECT_STREQ(o_.listen, "[::1]:0");
    EXPECT_TRUE(o_.have_remote);
    EXPECT_EQ(o_.remote_addr, 0x7f0000001000ull);
    EXPECT_EQ(o_.remote_len, 8ull << 30);
    EXPECT_EQ(bench_working_set(&o_), 2ull * 64 * (64ull << 20));
}

TEST_F(BenchOptionsTest, DepthMultipliesTheWorkingSet) {
    ASSERT_EQ(Parse({"-b", "4K,1M", "-B", "8,64", "-t", "1,4", "--depth", "3"}), 0) << err_;
    EXPECT_EQ(o_.depth, 3u);
    // The largest combination: 1M * 64 * 4 threads * 3 batches in flight.
    EXPECT_EQ(bench_working_set(&o_), 3ull * 4 * 64 * (1ull << 20));
    ASSERT_EQ(Parse({"--depth=16"}), 0) << err_;
    EXPECT_EQ(o_.depth, 16u);
}

TEST_F(BenchOptionsTest, TargetRole) {
    ASSERT_EQ(Parse({"--role", "target", "--listen", "0.0.0.0:5000"}), 0) << err_;
    EXPECT_EQ(o_.role, BENCH_ROLE_TARGET);
    EXPECT_EQ(o_.buffer_size, 1ull << 30) << "a standalone target defaults to 1G";
    ASSERT_EQ(Parse({"--role=target", "--buffer-size", "4K", "--report-fd", "7"}), 0) << err_;
    EXPECT_EQ(o_.buffer_size, 4096u);
    EXPECT_EQ(o_.report_fd, 7);
}

TEST_F(BenchOptionsTest, HelpAndRepeatedParsing) {
    EXPECT_EQ(Parse({"--op", "read", "--help"}), 1);
    EXPECT_EQ(Parse({"-h"}), 1);
    EXPECT_NE(std::string(bench_usage()).find("--block-size"), std::string::npos);
    // getopt state is reset: a second parse sees its own arguments only.
    ASSERT_EQ(Parse({"--op", "read", "-c"}), 0);
    EXPECT_EQ(o_.op, BENCH_OP_READ);
    ASSERT_EQ(Parse({"-j"}), 0);
    EXPECT_EQ(o_.op, BENCH_OP_WRITE);
    EXPECT_FALSE(o_.check);
    EXPECT_TRUE(o_.json);
}

TEST_F(BenchOptionsTest, RejectsBadValuesWithClearErrors) {
    ExpectError({"--bogus"}, "unknown option '--bogus'");
    ExpectError({"-x"}, "unknown option '-x'");
    ExpectError({"--op"}, "needs a value");
    ExpectError({"-b"}, "needs a value");
    ExpectError({"--op", "copy"}, "--op: 'copy' is not read or write");
    ExpectError({"--role", "server"}, "--role");
    ExpectError({"--transport", "udp"},
                "--transport: 'udp' is not a comma list of distinct tcp, rdma, shm");
    ExpectError({"--transports", "shm,shm"},
                "--transports: 'shm,shm' is not a comma list of distinct tcp, rdma, shm");
    for (const char *bad : {"", "shm,", ",tcp", "shm,,tcp", " tcp", "TCP"})
        ExpectError({"--transports", bad}, "is not a comma list of distinct tcp, rdma, shm");
    ExpectError({"-b", "0"}, "--block-size: 0 is out of range [1, 4G]");
    ExpectError({"-b", "5G"}, "--block-size: 5G is out of range");
    ExpectError({"-b", "4K,,8K"}, "comma-separated");
    ExpectError({"-b", "4K,"}, "comma-separated");
    ExpectError({"-b", ",4K"}, "comma-separated");
    ExpectError({"-b", ","}, "comma-separated");
    ExpectError({"-b", "4Q"}, "--block-size: '4Q' is not a number");
    ExpectError({"-b", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}, "more than 16");
    ExpectError({"-B", "0"}, "--batch-size: 0 is out of range [1, 4K]");
    ExpectError({"-B", "4097"}, "--batch-size");
    ExpectError({"-t", "65"}, "--threads: 65 is out of range [1, 64]");
    ExpectError({"-d", "0"}, "--duration: 0 is out of range [1ms, 24h]");
    ExpectError({"-d", "25h"}, "out of range");
    ExpectError({"-d", "soon"}, "--duration: 'soon' is not a duration");
    ExpectError({"-n", "0"}, "--total-bytes: 0 is out of range");
    ExpectError({"-n", "lots"}, "--total-bytes: 'lots' is not a size");
    ExpectError({"-d", "1s", "-n", "1M"}, "--duration and --total-bytes exclude each other");
    ExpectError({"--warmup", "-1"}, "--warmup");
    ExpectError({"--timeout", "0"}, "--timeout");
    ExpectError({"--target", "localhost"}, "--target: 'localhost' is not host:port");
    ExpectError({"--listen", "1.2.3.4:99999"}, "--listen");
    ExpectError({"--remote-addr", "0x1000", "--remote-len", "1G"}, "--remote-addr needs --target");
    ExpectError({"--target", "h:1", "--remote-addr", "0x1000"}, "go together");
    ExpectError({"--target", "h:1", "--remote-addr", "zz", "--remote-len", "1G"},
                "--remote-addr: 'zz'");
    ExpectError(
        {"--target", "h:1", "--remote-addr", "0x1000", "--remote-len", "1M", "-b", "1M", "-B", "2"},
        "does not fit --remote-len 1M");
    ExpectError({"--target", "h:1", "--buffer-size", "1G"}, "--buffer-size sizes a spawned target");
    ExpectError({"--buffer-size", "1M", "-b", "1M", "-B", "2"}, "smaller than");
    ExpectError({"--buffer-size", "1K"}, "--buffer-size: '1K' is not a size in [4K, 1T]");
    ExpectError({"-b", "4G", "-B", "4096", "-t", "64"}, "over the 64G limit");
    ExpectError({"--report-fd", "3"}, "--report-fd is internal");
    ExpectError({"--depth", "0"}, "--depth: '0' is not a count in [1, 16]");
    ExpectError({"--depth", "17"}, "--depth: '17'");
    ExpectError({"--depth", "2x"}, "--depth: '2x'");
    ExpectError({"-b", "1G", "-B", "4096", "-t", "16", "--depth", "2"},
                "threads * depth * batch * block");
    ExpectError({"--role", "target", "--depth", "2"}, "--depth is an initiator option");
    ExpectError({"--role", "target", "--op", "read"},
                "--op is an initiator option; not valid with --role target");
    ExpectError({"--role", "target", "--check"}, "--check is an initiator option");
    ExpectError({"--role", "target", "--target", "h:1"}, "--target is an initiator option");
    ExpectError({"extra"}, "unexpected argument 'extra'");
}

// Host (4 KiB pages), host on transparent huge pages, the engine's shared host memory,
// device memory: parsed, named back, and told apart (thp and shared are host memory, not
// a device).
TEST_F(BenchOptionsTest, MemoryKinds) {
    ASSERT_EQ(Parse({"--local-mem", "thp", "--remote-mem", "cuda:3"}), 0) << err_;
    EXPECT_EQ(o_.local_mem, BENCH_MEM_THP);
    EXPECT_EQ(o_.remote_mem, BENCH_MEM_CUDA(3));
    EXPECT_TRUE(BENCH_MEM_IS_HOST(o_.local_mem));
    EXPECT_FALSE(BENCH_MEM_IS_HOST(o_.remote_mem));
    ASSERT_EQ(Parse({"--local-mem", "host", "--remote-mem", "thp"}), 0) << err_;
    EXPECT_EQ(o_.local_mem, BENCH_MEM_HOST);
    EXPECT_EQ(o_.remote_mem, BENCH_MEM_THP);
    ASSERT_EQ(Parse({"--local-mem", "shared", "--remote-mem", "shared"}), 0) << err_;
    EXPECT_EQ(o_.local_mem, BENCH_MEM_SHARED);
    EXPECT_EQ(o_.remote_mem, BENCH_MEM_SHARED);
    EXPECT_TRUE(BENCH_MEM_IS_HOST(o_.local_mem));
    ASSERT_EQ(Parse({"--role", "target", "--remote-mem", "shared"}), 0) << err_;
    EXPECT_EQ(o_.remote_mem, BENCH_MEM_SHARED);
    char name[16];
    EXPECT_STREQ(bench_mem_name(BENCH_MEM_HOST, name, sizeof name), "host");
    EXPECT_STREQ(bench_mem_name(BENCH_MEM_THP, name, sizeof name), "thp");
    EXPECT_STREQ(bench_mem_name(BENCH_MEM_SHARED, name, sizeof name), "shared");
    EXPECT_STREQ(bench_mem_name(BENCH_MEM_CUDA(3), name, sizeof name), "cuda:3");
    EXPECT_STREQ(bench_mem_name(BENCH_MEM_CUDA(BENCH_MEM_CUDA_MAX), name, sizeof name), "cuda:239");
    unsigned m = 7;
    EXPECT_EQ(bench_parse_mem("shared", &m, nullptr), 0);
    EXPECT_EQ(m, BENCH_MEM_SHARED);
    m = 7;
    EXPECT_EQ(bench_parse_mem("thp2", &m, nullptr), -1);
    EXPECT_EQ(bench_parse_mem("THP", &m, nullptr), -1);
    EXPECT_EQ(bench_parse_mem("shared2", &m, nullptr), -1);
    EXPECT_EQ(bench_parse_mem("share", &m, nullptr), -1);
    EXPECT_EQ(bench_parse_mem("SHARED", &m, nullptr), -1);
    EXPECT_EQ(m, 7u); /* untouched on failure */
    /* Distinct from every other kind: no CUDA device number maps onto it. */
    EXPECT_NE(BENCH_MEM_SHARED, BENCH_MEM_THP);
    EXPECT_NE(BENCH_MEM_SHARED, BENCH_MEM_HOST);
    EXPECT_GT(BENCH_MEM_SHARED, BENCH_MEM_CUDA(BENCH_MEM_CUDA_MAX));
    ExpectError({"--local-mem", "huge"}, "is not host, thp, shared, file:PATH or cuda:N");
    ExpectError({"--remote-mem", "shm"},
                "--remote-mem: 'shm' is not host, thp, shared, file:PATH or cuda:N");
}

TEST_F(BenchOptionsTest, FileMemoryKind) {
    ASSERT_EQ(Parse({"--local-mem", "file:/data/a.bin", "--remote-mem", "file:b"}), 0) << err_;
    EXPECT_EQ(o_.local_mem, BENCH_MEM_FILE);
    EXPECT_EQ(o_.remote_mem, BENCH_MEM_FILE);
    EXPECT_STREQ(o_.local_file, "/data/a.bin");
    EXPECT_STREQ(o_.remote_file, "b");
    EXPECT_FALSE(BENCH_MEM_IS_HOST(o_.local_mem));
    EXPECT_GT(BENCH_MEM_FILE, BENCH_MEM_CUDA(BENCH_MEM_CUDA_MAX));
    char name[16];
    EXPECT_STREQ(bench_mem_name(BENCH_MEM_FILE, name, sizeof name), "file");
    unsigned m = 7;
    char path[BENCH_PATH_MAX] = "x";
    EXPECT_EQ(bench_parse_mem("file:", &m, path), -1);          /* no path */
    EXPECT_EQ(bench_parse_mem("file:/tmp/f", &m, nullptr), -1); /* nowhere to put it */
    EXPECT_EQ(bench_parse_mem(("file:" + std::string(BENCH_PATH_MAX, 'a')).c_str(), &m, path), -1);
    EXPECT_EQ(m, 7u);
    EXPECT_STREQ(path, "x");
    ExpectError({"--local-mem", "file:"}, "--local-mem: 'file:' is not host");
    ASSERT_EQ(Parse({"--sweep"}), 0) << err_;
    EXPECT_TRUE(o_.sweep);
    ExpectError({"--sweep", "--check"}, "--sweep and --check exclude each other");
    ExpectError({"--role", "target", "--sweep"}, "--sweep is an initiator option");
}

TEST_F(BenchLibTest, LatencyPercentilesNearestRank) {
    std::vector<uint64_t> s;
    uint64_t sum = 0;
    for (uint64_t i = 1; i <= 1000; i++) {
        s.push_back(i * 1000); // 1..1000 us
        sum += i * 1000;
    }
    std::shuffle(s.begin(), s.end(), std::mt19937_64(42));
    bench_latency_t l;
    bench_latency_summarize(s.data(), s.size(), sum, s.size(), &l);
    EXPECT_DOUBLE_EQ(l.avg_us, 500.5);
    EXPECT_DOUBLE_EQ(l.p50_us, 500.0);
    EXPECT_DOUBLE_EQ(l.p99_us, 990.0);
    EXPECT_DOUBLE_EQ(l.p999_us, 999.0);
    EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));

    // Few samples: the high percentiles are the largest sample.
    uint64_t three[] = {3000, 1000, 2000};
    bench_latency_summarize(three, 3, 6000, 3, &l);
    EXPECT_DOUBLE_EQ(l.avg_us, 2.0);
    EXPECT_DOUBLE_EQ(l.p50_us, 2.0);
    EXPECT_DOUBLE_EQ(l.p99_us, 3.0);
    EXPECT_DOUBLE_EQ(l.p999_us, 3.0);

    // The average covers every sample taken, also those the reservoir dropped.
    uint64_t one[] = {1500};
    bench_latency_summarize(one, 1, 10000, 4, &l);
    EXPECT_DOUBLE_EQ(l.avg_us, 2.5);
    EXPECT_DOUBLE_EQ(l.p50_us, 1.5);

    bench_latency_summarize(nullptr, 0, 0, 0, &l);
    EXPECT_EQ(l.avg_us, 0.0);
    EXPECT_EQ(l.p999_us, 0.0);
}

bench_result_t SampleResult() {
    bench_result_t r;
    memset(&r, 0, sizeof r);
    r.transport = "tcp";
    r.op = BENCH_OP_WRITE;
    r.block_size = 4096;
    r.batch_size = 64;
    r.threads = 2;
    r.bytes = 4096ull * 1000000;
    r.requests = 1000000;
    r.seconds = 2.0;
    r.lat.avg_us = 12.5;
    r.lat.p50_us = 11;
    r.lat.p99_us = 40.25;
    r.lat.p999_us = 100;
    r.check = BENCH_CHECK_OK;
    return r;
}

// The keys of a flat JSON object, in order.
std::vector<std::string> JsonKeys(const std::string &json) {
    std::vector<std::string> keys;
    size_t pos = 0;
    while ((pos = json.find('"', pos)) != std::string::npos) {
        size_t end = json.find('"', pos + 1);
        if (end == std::string::npos) break;
        if (end + 1 < json.size() && json[end + 1] == ':')
            keys.push_back(json.substr(pos + 1, end - pos - 1));
        pos = end + 1;
    }
    return keys;
}

TEST_F(BenchLibTest, JsonLineHasExactlyTheContractKeys) {
    bench_result_t r = SampleResult();
    char buf[512];
    int n = bench_format_json(&r, buf, sizeof buf);
    ASSERT_GT(n, 0);
    ASSERT_LT(static_cast<size_t>(n), sizeof buf);
    EXPECT_STREQ(buf,
                 "{\"transport\":\"tcp\",\"op\":\"write\",\"block_size\":4096,\"batch_size\":64,"
                 "\"threads\":2,\"bytes\":4096000000,\"seconds\":2.000000,\"gbps\":2.0480,"
                 "\"ops_per_sec\":500000.0,\"lat_avg_us\":12.500,\"lat_p50_us\":11.000,"
                 "\"lat_p99_us\":40.250,\"lat_p999_us\":100.000,\"check\":\"ok\","
                 "\"local_mem\":\"host\",\"remote_mem\":\"host\",\"path\":\"host\","
                 "\"per_nic\":{},\"grants\":0}");
    std::vector<std::string> want = {"transport",   "op",         "block_size", "batch_size",
                                     "threads",     "bytes",      "seconds",    "gbps",
                                     "ops_per_sec", "lat_avg_us", "lat_p50_us", "lat_p99_us",
                                     "lat_p999_us", "check",      "local_mem",  "remote_mem",
                                     "path",        "per_nic",    "grants"};
    EXPECT_EQ(JsonKeys(buf), want);

    // Bytes per NIC: one member per device, in the engine's order.
    bench_result_t nics = r;
    nics.nnic = 2;
    snprintf(nics.nic[0].name, sizeof nics.nic[0].name, "mlx5_0");
    nics.nic[0].bytes = 2048000000;
    snprintf(nics.nic[1].name, sizeof nics.nic[1].name, "mlx5_1");
    nics.nic[1].bytes = 2048000001;
    nics.grants = 4096;
    char nbuf[1024];
    ASSERT_GT(bench_format_json(&nics, nbuf, sizeof nbuf), 0);
    EXPECT_NE(std::string(nbuf).find(
                  ",\"per_nic\":{\"mlx5_0\":2048000000,\"mlx5_1\":2048000001},\"grants\":4096}"),
              std::string::npos)
        << nbuf;
    EXPECT_EQ(std::string(buf).find('\n'), std::string::npos);

    r.op = BENCH_OP_READ;
    r.check = BENCH_CHECK_FAILED;
    bench_format_json(&r, buf, sizeof buf);
    EXPECT_NE(std::string(buf).find("\"op\":\"read\""), std::string::npos);
    EXPECT_NE(std::string(buf).find("\"check\":\"failed\""), std::string::npos);
    r.check = BENCH_CHECK_OFF;
    bench_format_json(&r, buf, sizeof buf);
    EXPECT_NE(std::string(buf).find("\"check\":\"off\""), std::string::npos);

    // No NaN or infinity ever reaches the JSON.
    r.seconds = 0;
    r.lat.avg_us = NAN;
    r.lat.p99_us = INFINITY;
    bench_format_json(&r, buf, sizeof buf);
    std::string s(buf);
    EXPECT_EQ(s.find("nan"), std::string::npos) << s;
    EXPECT_EQ(s.find("inf"), std::string::npos) << s;
    EXPECT_NE(s.find("\"gbps\":0.0000"), std::string::npos) << s;
}

TEST_F(BenchLibTest, TableRowLinesUpWithHeader) {
    bench_result_t r = SampleResult();
    char hdr[256], row[256];
    ASSERT_GT(bench_format_table_header(hdr, sizeof hdr), 0);
    ASSERT_GT(bench_format_table_row(&r, row, sizeof row), 0);
    std::string h(hdr), w(row);
    for (const char *col : {"block", "batch", "threads", "GB/s", "ops/s", "avg_us", "p50_us",
                            "p99_us", "p99.9_us", "check"})
        EXPECT_NE(h.find(col), std::string::npos) << col;
    EXPECT_NE(w.find(" 4K "), std::string::npos) << w;
    EXPECT_NE(w.find("2.048"), std::string::npos) << w;
    EXPECT_NE(w.find("500000"), std::string::npos) << w;
    EXPECT_EQ(h.find("check"), w.find("ok")) << "check column aligned";
}

TEST_F(BenchLibTest, PatternDependsOnOffsetAndSeed) {
    const size_t kLen = 9000;
    std::vector<uint8_t> whole(kLen);
    bench_pattern_fill(whole.data(), 0, kLen, 77);
    uint64_t bad = 1;
    EXPECT_TRUE(bench_pattern_check(whole.data(), 0, kLen, 77, &bad));

    // Any sub-range filled on its own equals the same bytes of the whole: local and remote
    // copies of one offset agree whatever their alignment.
    for (size_t off : {0, 1, 3, 7, 8, 9, 4095, 4097}) {
        for (size_t len : {0, 1, 2, 7, 8, 9, 15, 16, 17, 100, 4097}) {
            std::vector<uint8_t> part(len + 1);
            uint8_t *p = part.data() + 1; // unaligned destination
            bench_pattern_fill(p, off, len, 77);
            ASSERT_EQ(memcmp(p, whole.data() + off, len), 0) << off << "+" << len;
            EXPECT_TRUE(bench_pattern_check(p, off, len, 77, nullptr));
        }
    }
    // Neighbouring words differ, so a block at the wrong offset is caught.
    EXPECT_NE(memcmp(whole.data(), whole.data() + 8, 8), 0);
    EXPECT_FALSE(bench_pattern_check(whole.data() + 4096, 0, 4096, 77, &bad));
    // Another seed (an earlier run) is caught.
    EXPECT_FALSE(bench_pattern_check(whole.data(), 0, kLen, 78, &bad));
    EXPECT_EQ(bad, 0u);

    // One flipped byte anywhere is found at its exact offset.
    for (size_t flip : {0, 5, 8, 4095, 8999}) {
        std::vector<uint8_t> c = whole;
        c[flip] ^= 0x01;
        bad = 0;
        EXPECT_FALSE(bench_pattern_check(c.data(), 0, kLen, 77, &bad)) << flip;
        EXPECT_EQ(bad, flip);
        // Checked from an unaligned start offset too; a flip before the start is outside.
        bad = 0;
        if (flip >= 3) {
            EXPECT_FALSE(bench_pattern_check(c.data() + 3, 3, kLen - 3, 77, &bad)) << flip;
            EXPECT_EQ(bad, flip);
        } else {
            EXPECT_TRUE(bench_pattern_check(c.data() + 3, 3, kLen - 3, 77, &bad)) << flip;
        }
    }
    // All-zero memory (a WRITE that never landed) fails.
    std::vector<uint8_t> zero(64, 0);
    EXPECT_FALSE(bench_pattern_check(zero.data(), 0, zero.size(), 77, nullptr));
}

TEST_F(BenchLibTest, ControlMessagesRoundTrip) {
    bench_ctl_msg_t msgs[] = {
        {1, BENCH_CTL_INFO, 0, 0, 0, ""},
        {2, BENCH_CTL_FILL, 99, 4096, 1ull << 30, ""},
        {3, BENCH_CTL_ZERO, 0, 12345, 0, ""},
        {4, BENCH_CTL_VERIFY, UINT64_MAX, 0, 7, ""},
        {5, BENCH_CTL_QUIT, 0, 0, 0, ""},
        {6, BENCH_CTL_OK, 0x7f0011223000ull, 1ull << 30, 0, ""},
        {7, BENCH_CTL_OK, 0, 0, 0, ""},
        {8, BENCH_CTL_BAD, 4242, 0, 0, ""},
        {UINT64_MAX, BENCH_CTL_ERR, 0, 0, 0, "range outside the buffer"},
    };
    for (const auto &m : msgs) {
        char buf[256];
        int n = bench_ctl_format(&m, buf, sizeof buf);
        ASSERT_GT(n, 0);
        bench_ctl_msg_t back;
        ASSERT_EQ(bench_ctl_parse(buf, static_cast<size_t>(n), &back), 0) << buf;
        EXPECT_EQ(back.id, m.id) << buf;
        EXPECT_EQ(back.verb, m.verb) << buf;
        EXPECT_EQ(back.a, m.a) << buf;
        EXPECT_EQ(back.b, m.b) << buf;
        EXPECT_EQ(back.c, m.c) << buf;
        EXPECT_STREQ(back.text, m.text) << buf;
    }
    char tiny[8];
    EXPECT_EQ(bench_ctl_format(&msgs[1], tiny, sizeof tiny), -1);
}

TEST_F(BenchLibTest, ControlParserRejectsMalformedMessages) {
    const char *bad[] = {
        "",
        "OTEB2 1 INFO",
        "OTEB1 INFO",
        "OTEB1 x INFO",
        "OTEB1 1",
        "OTEB1 1 NOPE",
        "OTEB1 1 INFO extra",
        "OTEB1 1 FILL 1 2",
        "OTEB1 1 FILL 1 2 3 4",
        "OTEB1 1 FILL 1 -2 3",
        "OTEB1 1 ZERO 1",
        "OTEB1 1 VERIFY a b c",
        "OTEB1 1 OK 5",
        "OTEB1 1 BAD",
        "OTEB1 -1 QUIT",
    };
    for (const char *s : bad) {
        bench_ctl_msg_t m;
        m.id = 555;
        EXPECT_EQ(bench_ctl_parse(s, strlen(s), &m), -1) << "'" << s << "'";
        EXPECT_EQ(m.id, 555u) << "output written on failure for " << s;
    }
    const char with_nul[] = "OTEB1 1 QUIT\0junk";
    bench_ctl_msg_t m;
    EXPECT_EQ(bench_ctl_parse(with_nul, sizeof with_nul - 1, &m), -1);
    std::string huge = "OTEB1 1 ERR " + std::string(400, 'x');
    EXPECT_EQ(bench_ctl_parse(huge.data(), huge.size(), &m), -1);
    // Not NUL-terminated input is read only up to len.
    const char exact[] = "OTEB1 9 QUITXXXX";
    ASSERT_EQ(bench_ctl_parse(exact, 12, &m), 0);
    EXPECT_EQ(m.verb, BENCH_CTL_QUIT);
    EXPECT_EQ(m.id, 9u);
}

TEST_F(BenchLibTest, TargetReportLine) {
    char line[400];
    ASSERT_GT(
        bench_report_format("127.0.0.1:40123", 0x7f1200000000ull, 1ull << 30, line, sizeof line),
        0);
    EXPECT_STREQ(line, "OTEB1 TARGET 127.0.0.1:40123 0x7f1200000000 1073741824");
    char addr[BENCH_ADDR_MAX];
    uint64_t a = 0, l = 0;
    std::string with_nl = std::string(line) + "\n";
    ASSERT_EQ(bench_report_parse(with_nl.c_str(), addr, sizeof addr, &a, &l), 0);
    EXPECT_STREQ(addr, "127.0.0.1:40123");
    EXPECT_EQ(a, 0x7f1200000000ull);
    EXPECT_EQ(l, 1ull << 30);
    ASSERT_EQ(bench_report_parse("OTEB1 TARGET [::1]:9 0x1000 4096", addr, sizeof addr, &a, &l), 0);
    EXPECT_STREQ(addr, "[::1]:9");
    for (const char *s :
         {"", "OTEB1 TARGET", "OTEB1 TARGET h:1 0x1000", "OTEB1 TARGET h:1 0x1000 4096 extra",
          "OTEB1 TARGET nohost 0x1000 1", "OTEB1 TARGET h:1 0x0 4096", "OTEB1 TARGET h:1 0x1000 0",
          "OTEB1 OTHER h:1 0x1000 1", "XXXXX TARGET h:1 0x1000 1"})
        EXPECT_EQ(bench_report_parse(s, addr, sizeof addr, &a, &l), -1) << s;
}

} // namespace
