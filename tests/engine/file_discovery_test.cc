// tests/engine/file_discovery_test.cc - buffer discovery of file registrations behind the
// protocol gate (engine/control/ctl.h, version 4; docs/files.md): two engines of this
// version list the peer's file registrations (kind OTE_MEM_FILE, after its memory ones,
// as they come and go); a requester that speaks at most version 3 (every engine before
// the gate) gets a list without them, which its decoder accepts; the decoder refuses a
// file entry in a frame below version 4 and takes it from 4 on, the encoder refuses to
// write one below 4. Metadata blobs list file registrations in version 3 only (an engine
// without files still writes version 1 or 2, which engines before files read); a peer
// opened from such a blob serves READs and WRITEs of the file.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/engine/ctl_peer.h"
#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/le.h"
#include "engine/control/ctl.h"
#include "ote/ote.h"
}

namespace {

using ote_test::NewEngine;

std::string MakeFile(const char *name, size_t n) {
    const char *d = getenv("TEST_TMPDIR");
    std::string p = std::string(d != nullptr ? d : "/tmp") + "/" + name;
    int fd = open(p.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(n)), 0);
    close(fd);
    return p;
}

std::vector<ote_buffer_info_t> List(ote_segment_t *seg) {
    std::vector<ote_buffer_info_t> out(16);
    size_t n = 12345;
    EXPECT_EQ(ote_segment_buffers(seg, out.data(), out.size(), &n), OTE_OK);
    out.resize(n == 12345 ? 0 : n);
    return out;
}

// A raw ROLE_INFO connection speaking versions [1, max_version]: the source's BUFS frame,
// decoded into *m (its bytes in *frame).
void AskRaw(ote_engine_t *src, uint16_t max_version, std::vector<uint8_t> *frame,
            ote_ctl_msg_t *m) {
    int fd = ote_test::ConnectTo(ote_test::EngineAddress(src), 4096);
    ASSERT_GE(fd, 0);
    ote_ctl_msg_t h{};
    h.version = max_version;
    h.opcode = OTE_CTL_HELLO;
    h.req_id = 1;
    h.u.hello.min_version = OTE_CTL_VERSION_MIN;
    h.u.hello.max_version = max_version;
    h.u.hello.role = OTE_CTL_ROLE_INFO;
    ASSERT_TRUE(ote_test::SendAll(fd, ote_test::Encode(h)));
    std::vector<uint8_t> buf;
    ASSERT_TRUE(ote_test::ReadFrame(fd, &buf, m));
    ASSERT_EQ(m->opcode, OTE_CTL_HELLO_ACK);
    uint16_t ver = m->u.hello_ack.version;
    ASSERT_EQ(ver, max_version);
    std::vector<uint8_t> req(OTE_CTL_HDR_LEN);
    ote_ctl_put_hdr(req.data(), ver, OTE_CTL_BUFS_REQ, 7, OTE_OK, 0);
    ASSERT_TRUE(ote_test::SendAll(fd, req));
    ASSERT_TRUE(ote_test::ReadFrame(fd, frame, m));
    ASSERT_EQ(m->opcode, OTE_CTL_BUFS);
    ASSERT_EQ(m->version, ver);
    close(fd);
}

// A tcp source with 8 KiB of memory registered as "mem" (READ), and a tcp requester.
void TcpPair(ote_engine_t **src, ote_engine_t **req, std::vector<uint8_t> *mem) {
    *src = NewEngine({{"transports", "tcp"}});
    *req = NewEngine({{"transports", "tcp"}});
    ASSERT_NE(*src, nullptr);
    ASSERT_NE(*req, nullptr);
    mem->assign(8192, 0);
    ASSERT_EQ(ote_memory_register_named(*src, mem->data(), mem->size(), OTE_PERM_READ, "mem"),
              OTE_OK);
}

class FileDiscoveryTest : public ote_test::OteTest {};

TEST_F(FileDiscoveryTest, PeersOfThisVersionListFileRegistrations) {
    std::string path = MakeFile("disc_a.bin", 1u << 20);
    ote_engine_t *src = nullptr, *req = nullptr;
    std::vector<uint8_t> mem;
    ASSERT_NO_FATAL_FAILURE(TcpPair(&src, &req, &mem));
    uint64_t fa = 0, fb = 0;
    ASSERT_EQ(ote_file_register(src, path.c_str(), -1, 4096, 65536, OTE_PERM_READ | OTE_PERM_WRITE,
                                "kv", &fa),
              OTE_OK);
    ASSERT_EQ(ote_file_register(src, path.c_str(), -1, 0, 4096, OTE_PERM_READ, nullptr, &fb),
              OTE_OK);
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(req, ote_test::EngineAddress(src).c_str(), &seg), OTE_OK);
    std::vector<ote_buffer_info_t> l = List(seg);
    ASSERT_EQ(l.size(), 3u);
    EXPECT_STREQ(l[0].name, "mem");
    EXPECT_EQ(l[0].kind, static_cast<uint32_t>(OTE_MEM_HOST));
    EXPECT_EQ(l[1].addr, fa);
    EXPECT_EQ(l[1].length, 65536u);
    EXPECT_EQ(l[1].perms, OTE_PERM_READ | OTE_PERM_WRITE);
    EXPECT_EQ(l[1].kind, static_cast<uint32_t>(OTE_MEM_FILE));
    EXPECT_STREQ(l[1].name, "kv");
    EXPECT_EQ(l[2].addr, fb);
    EXPECT_EQ(l[2].length, 4096u);
    EXPECT_EQ(l[2].perms, static_cast<unsigned>(OTE_PERM_READ));
    EXPECT_EQ(l[2].kind, static_cast<uint32_t>(OTE_MEM_FILE));
    EXPECT_STREQ(l[2].name, "");
    // What ote_file_query says of its own registration, the peer lists.
    ote_buffer_info_t q{};
    ASSERT_EQ(ote_file_query(src, fa + 10, &q), OTE_OK);
    EXPECT_EQ(0, memcmp(&q, &l[1], sizeof(q)));
    // Gone once unregistered.
    ASSERT_EQ(ote_file_unregister(src, fa), OTE_OK);
    l = List(seg);
    ASSERT_EQ(l.size(), 2u);
    EXPECT_EQ(l[1].addr, fb);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_file_unregister(src, fb), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    unlink(path.c_str());
}

// A requester of version 3 (as every engine before the gate): no file entry, so its
// decoder (which refuses the kind) takes the list; at version 4 the same source lists it.
TEST_F(FileDiscoveryTest, RequesterBeforeTheGateGetsNoFileEntry) {
    static_assert(OTE_CTL_VERSION_MAX >= OTE_CTL_FILES_VERSION, "the gate");
    std::string path = MakeFile("disc_b.bin", 65536);
    ote_engine_t *src = NewEngine({{"transports", "tcp"}});
    ASSERT_NE(src, nullptr);
    std::vector<uint8_t> mem(4096);
    ASSERT_EQ(ote_memory_register(src, mem.data(), mem.size(), OTE_PERM_WRITE), OTE_OK);
    uint64_t fa = 0;
    ASSERT_EQ(ote_file_register(src, path.c_str(), -1, 0, 65536, OTE_PERM_READ, "f", &fa), OTE_OK);
    std::vector<uint8_t> frame;
    ote_ctl_msg_t m{};
    ASSERT_NO_FATAL_FAILURE(AskRaw(src, OTE_CTL_FILES_VERSION - 1, &frame, &m));
    EXPECT_EQ(m.u.bufs.total, 1u);
    ASSERT_EQ(m.u.bufs.count, 1u);
    ote_ctl_buf_t b{};
    ASSERT_EQ(ote_ctl_buf_get(&m, 0, &b), OTE_OK);
    EXPECT_EQ(b.addr, reinterpret_cast<uintptr_t>(mem.data()));
    ASSERT_NO_FATAL_FAILURE(AskRaw(src, OTE_CTL_FILES_VERSION, &frame, &m));
    EXPECT_EQ(m.u.bufs.total, 2u);
    ASSERT_EQ(m.u.bufs.count, 2u);
    ASSERT_EQ(ote_ctl_buf_get(&m, 1, &b), OTE_OK);
    EXPECT_EQ(b.addr, fa);
    EXPECT_EQ(b.kind, OTE_CTL_BUF_KIND_FILE);
    EXPECT_STREQ(b.name, "f");
    EXPECT_EQ(ote_file_unregister(src, fa), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    unlink(path.c_str());
}

// The codec: a BUFS frame with a file entry decodes at version 4 and is refused below it;
// the encoder refuses to write one below it. A metadata blob carries one in version 3
// only.
TEST_F(FileDiscoveryTest, CodecGatesTheFileKindByVersion) {
    ote_ctl_buf_t b{};
    b.addr = 0xF000000000000000ull;
    b.len = 4096;
    b.perms = OTE_PERM_READ;
    b.kind = OTE_CTL_BUF_KIND_FILE;
    std::strcpy(b.name, "kv");
    EXPECT_FALSE(ote_ctl_buf_kind_ok(OTE_CTL_BUF_KIND_FILE)); // not in every version
    std::vector<uint8_t> ent(OTE_CTL_BUF_ENTRY_LEN);
    ASSERT_EQ(ote_ctl_buf_put(ent.data(), &b), OTE_OK);
    for (uint16_t v = OTE_CTL_VERSION_MIN; v <= OTE_CTL_VERSION_MAX; v++) {
        ote_ctl_msg_t m{};
        m.version = v;
        m.opcode = OTE_CTL_BUFS;
        m.req_id = 3;
        m.u.bufs.total = 1;
        m.u.bufs.count = 1;
        m.u.bufs.entries = ent.data();
        std::vector<uint8_t> f(OTE_CTL_HDR_LEN + 8 + OTE_CTL_BUF_ENTRY_LEN);
        size_t len = 0;
        ote_status_t est = ote_ctl_encode(&m, f.data(), f.size(), &len);
        // The same bytes, written by hand, as a peer of any version might send them.
        ote_ctl_put_hdr(f.data(), v, OTE_CTL_BUFS, 3, OTE_OK, 8 + OTE_CTL_BUF_ENTRY_LEN);
        ote_le_put32(f.data() + OTE_CTL_HDR_LEN, 1);
        ote_le_put32(f.data() + OTE_CTL_HDR_LEN + 4, 1);
        std::memcpy(f.data() + OTE_CTL_HDR_LEN + 8, ent.data(), ent.size());
        ote_ctl_msg_t d{};
        size_t used = 0;
        ote_status_t dst = ote_ctl_decode(f.data(), f.size(), &d, &used);
        if (v >= OTE_CTL_FILES_VERSION) {
            EXPECT_EQ(est, OTE_OK) << v;
            ASSERT_EQ(dst, OTE_OK) << v;
            ote_ctl_buf_t got{};
            ASSERT_EQ(ote_ctl_buf_get(&d, 0, &got), OTE_OK);
            EXPECT_EQ(got.kind, OTE_CTL_BUF_KIND_FILE);
            EXPECT_EQ(got.addr, b.addr);
        } else {
            EXPECT_EQ(ote_status_code(est), OTE_ERR_INVALID) << v;
            EXPECT_EQ(ote_status_code(dst), OTE_ERR_PROTOCOL) << v;
        }
    }
    // Metadata blobs: a file entry makes the blob version 3 (name section, maybe empty),
    // which only this decoder reads; versions 1 and 2 never carry one.
    ote_ctl_buf_t mem{};
    mem.addr = 0x10000;
    mem.len = 4096;
    mem.perms = OTE_PERM_READ;
    mem.kind = OTE_CTL_BUF_KIND_HOST;
    std::vector<uint8_t> blob(4096);
    for (const char *name : {static_cast<const char *>(nullptr), "eng"}) {
        ote_ctl_buf_t two[2] = {mem, b};
        size_t blen = 0;
        ASSERT_EQ(
            ote_ctl_md_encode("127.0.0.1:1", name, 1, two, 2, blob.data(), blob.size(), &blen),
            OTE_OK);
        EXPECT_EQ(ote_le_get16(blob.data() + 4), OTE_CTL_MD_VERSION_FILES);
        ote_ctl_md_t md{};
        ASSERT_EQ(ote_ctl_md_decode(blob.data(), blen, &md), OTE_OK);
        EXPECT_STREQ(md.name, name != nullptr ? name : "");
        ASSERT_EQ(md.count, 2u);
        ote_ctl_buf_t got{};
        ASSERT_EQ(ote_ctl_md_buf(&md, 1, &got), OTE_OK);
        EXPECT_EQ(got.kind, OTE_CTL_BUF_KIND_FILE);
        EXPECT_EQ(got.addr, b.addr);
        // The same entries under version 2 (named) or 1 (unnamed: no name section), each
        // well formed but for the file entry: refused.
        std::vector<uint8_t> old(blob.begin(), blob.begin() + static_cast<long>(blen));
        if (name != nullptr) {
            ote_le_put16(old.data() + 4, OTE_CTL_MD_VERSION_NAMED);
        } else {
            old.resize(old.size() - 2);
            ote_le_put16(old.data() + 4, OTE_CTL_MD_VERSION);
        }
        EXPECT_EQ(ote_ctl_md_decode(old.data(), old.size(), &md), OTE_ERR_PROTOCOL);
        ote_le_put32(old.data() + OTE_CTL_MD_HDR_LEN + 11 + OTE_CTL_BUF_ENTRY_LEN + 20,
                     OTE_CTL_BUF_KIND_HOST); // the same blob with a memory entry instead
        EXPECT_EQ(ote_ctl_md_decode(old.data(), old.size(), &md), OTE_OK);
        // Without the file entry: the version of before (1 unnamed, 2 named).
        ASSERT_EQ(
            ote_ctl_md_encode("127.0.0.1:1", name, 1, &mem, 1, blob.data(), blob.size(), &blen),
            OTE_OK);
        EXPECT_EQ(ote_le_get16(blob.data() + 4),
                  name != nullptr ? OTE_CTL_MD_VERSION_NAMED : OTE_CTL_MD_VERSION);
        // A version-3 blob without a file entry is not one this encoder writes: refused.
        std::vector<uint8_t> v3(blen + (name != nullptr ? 0 : 2), 0);
        std::memcpy(v3.data(), blob.data(), blen);
        ote_le_put16(v3.data() + 4, OTE_CTL_MD_VERSION_FILES);
        EXPECT_EQ(ote_ctl_md_decode(v3.data(), v3.size(), &md), OTE_ERR_PROTOCOL);
    }
}

// An engine's blob lists its file registrations (version 3) after its memory ones; a
// requester that opens the segment from the blob reads and writes the file's bytes; once
// the file is unregistered the blob is version 1 again.
TEST_F(FileDiscoveryTest, MetadataBlobListsFileRegistrations) {
    std::string path = MakeFile("disc_md.bin", 1u << 20);
    ote_engine_t *src = nullptr, *req = nullptr;
    std::vector<uint8_t> mem;
    ASSERT_NO_FATAL_FAILURE(TcpPair(&src, &req, &mem));
    uint64_t fa = 0;
    ASSERT_EQ(ote_file_register(src, path.c_str(), -1, 0, 1u << 20, OTE_PERM_READ | OTE_PERM_WRITE,
                                "kv", &fa),
              OTE_OK);
    std::vector<uint8_t> blob(1u << 16);
    size_t blen = 0;
    ASSERT_EQ(ote_engine_metadata(src, blob.data(), blob.size(), &blen), OTE_OK);
    EXPECT_EQ(ote_le_get16(blob.data() + 4), OTE_CTL_MD_VERSION_FILES);
    std::vector<ote_buffer_info_t> l(4);
    size_t n = 0;
    ASSERT_EQ(ote_engine_metadata_buffers(blob.data(), blen, l.data(), l.size(), &n), OTE_OK);
    ASSERT_EQ(n, 2u);
    EXPECT_STREQ(l[0].name, "mem");
    EXPECT_EQ(l[0].kind, static_cast<uint32_t>(OTE_MEM_HOST));
    ote_buffer_info_t q{};
    ASSERT_EQ(ote_file_query(src, fa, &q), OTE_OK);
    EXPECT_EQ(l[1].addr, fa);
    EXPECT_EQ(l[1].length, q.length);
    EXPECT_EQ(l[1].perms, q.perms);
    EXPECT_EQ(l[1].kind, static_cast<uint32_t>(OTE_MEM_FILE));
    EXPECT_STREQ(l[1].name, "kv");
    // The blob is enough to move the file's bytes: WRITE 64 KiB at 4 KiB, READ them back.
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open_md(req, blob.data(), blen, &seg), OTE_OK);
    std::vector<uint8_t> out(65536), in(65536, 0);
    for (size_t i = 0; i < out.size(); i++) out[i] = static_cast<uint8_t>(i * 7 + 3);
    ASSERT_EQ(ote_memory_register(req, out.data(), out.size(), OTE_PERM_READ), OTE_OK);
    ASSERT_EQ(ote_memory_register(req, in.data(), in.size(), OTE_PERM_WRITE), OTE_OK);
    ote_request_t w{};
    w.opcode = OTE_WRITE;
    w.local_addr = out.data();
    w.segment = seg;
    w.remote_addr = l[1].addr + 4096;
    w.length = out.size();
    ote_transfer_status_t ts{};
    ASSERT_EQ(ote_test::RunOne(req, w, 30000000000ull, &ts), OTE_OK);
    ASSERT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
    ote_request_t r = w;
    r.opcode = OTE_READ;
    r.local_addr = in.data();
    ASSERT_EQ(ote_test::RunOne(req, r, 30000000000ull, &ts), OTE_OK);
    ASSERT_EQ(ts.state, OTE_TRANSFER_COMPLETED) << ote_status_str(ts.error);
    EXPECT_EQ(in, out);
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> disk(out.size());
    EXPECT_EQ(pread(fd, disk.data(), disk.size(), 4096), static_cast<ssize_t>(disk.size()));
    close(fd);
    EXPECT_EQ(disk, out);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    ASSERT_EQ(ote_file_unregister(src, fa), OTE_OK);
    ASSERT_EQ(ote_engine_metadata(src, blob.data(), blob.size(), &blen), OTE_OK);
    EXPECT_EQ(ote_le_get16(blob.data() + 4), OTE_CTL_MD_VERSION);
    ASSERT_EQ(ote_engine_metadata_buffers(blob.data(), blen, l.data(), l.size(), &n), OTE_OK);
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(ote_memory_unregister(req, out.data()), OTE_OK);
    EXPECT_EQ(ote_memory_unregister(req, in.data()), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(req), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(src), OTE_OK);
    unlink(path.c_str());
}

} // namespace
