// ote_vm_check (base/vm.h) over real mappings made by the test: what a user can hand to a
// registration (anonymous, PROT_NONE, read-only, a hole, a range running from mapped into
// unmapped memory, files and memfds shorter than their mapping), every verdict and the
// address it names, and the fallback without /proc (fault point vm.maps_open).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/util/test_base.h"

extern "C" {
#include "base/fault.h"
#include "base/vm.h"
}

namespace {

using ote_test::OteTest;

const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

uint64_t U(const void *p) { return reinterpret_cast<uint64_t>(p); }

// n pages mapped anonymous, private, with prot.
uint8_t *Map(size_t pages, int prot) {
    void *p = mmap(nullptr, pages * kPage, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t *>(p);
}

ote_vm_report_t Check(uint64_t addr, uint64_t len, unsigned access) {
    ote_vm_report_t r;
    memset(&r, 0xee, sizeof(r));
    EXPECT_EQ(ote_vm_check(addr, len, access, &r), OTE_OK);
    return r;
}

class VmTest : public OteTest {};

TEST_F(VmTest, ArgumentsAreChecked) {
    ote_vm_report_t r;
    int x = 0;
    EXPECT_EQ(ote_vm_check(U(&x), 0, OTE_VM_READ, &r), OTE_ERR_INVALID);
    EXPECT_EQ(ote_vm_check(U(&x), 4, 0, &r), OTE_ERR_INVALID);
    EXPECT_EQ(ote_vm_check(U(&x), 4, 0x10, &r), OTE_ERR_INVALID);
    EXPECT_EQ(ote_vm_check(U(&x), 4, OTE_VM_READ, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_vm_check(UINT64_MAX - 3, 8, OTE_VM_READ, &r), OTE_ERR_INVALID);
}

TEST_F(VmTest, HeapStackAndAnonymousMemoryAreReadWrite) {
    int on_stack[64] = {};
    auto s = Check(U(on_stack), sizeof(on_stack), OTE_VM_READ | OTE_VM_WRITE);
    EXPECT_EQ(s.verdict, OTE_VM_OK);
    EXPECT_EQ(s.prot, OTE_VM_READ | OTE_VM_WRITE);
    void *h = malloc(1 << 20);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(Check(U(h), 1 << 20, OTE_VM_WRITE).verdict, OTE_VM_OK);
    free(h);
    uint8_t *p = Map(16, PROT_READ | PROT_WRITE);
    ASSERT_NE(p, nullptr);
    // Never touched: still mapped, still allowed.
    auto a = Check(U(p) + 1, 16 * kPage - 2, OTE_VM_READ | OTE_VM_WRITE);
    EXPECT_EQ(a.verdict, OTE_VM_OK);
    munmap(p, 16 * kPage);
}

TEST_F(VmTest, AdjacentMappingsJoinAndTheWeakestProtectionIsReported) {
    uint8_t *p = Map(4, PROT_READ | PROT_WRITE);
    ASSERT_NE(p, nullptr);
    // Two neighbouring mappings of different protection, one range over both.
    ASSERT_EQ(mprotect(p + 2 * kPage, 2 * kPage, PROT_READ), 0);
    auto r = Check(U(p), 4 * kPage, OTE_VM_READ);
    EXPECT_EQ(r.verdict, OTE_VM_OK);
    EXPECT_EQ(r.prot, OTE_VM_READ);
    auto w = Check(U(p), 4 * kPage, OTE_VM_WRITE);
    EXPECT_EQ(w.verdict, OTE_VM_NO_ACCESS);
    EXPECT_EQ(w.at, U(p) + 2 * kPage);
    EXPECT_EQ(std::string(w.what).substr(0, 4), "r--p");
    EXPECT_EQ(Check(U(p), 2 * kPage, OTE_VM_WRITE).verdict, OTE_VM_OK);
    munmap(p, 4 * kPage);
}

TEST_F(VmTest, ProtNoneIsNoAccessForEither) {
    uint8_t *p = Map(2, PROT_NONE);
    ASSERT_NE(p, nullptr);
    for (unsigned acc : {OTE_VM_READ, OTE_VM_WRITE, OTE_VM_READ | OTE_VM_WRITE}) {
        auto r = Check(U(p) + 10, 100, acc);
        EXPECT_EQ(r.verdict, OTE_VM_NO_ACCESS);
        EXPECT_EQ(r.at, U(p) + 10);
        EXPECT_EQ(std::string(r.what).substr(0, 4), "---p");
    }
    munmap(p, 2 * kPage);
}

TEST_F(VmTest, HolesAndRangesRunningIntoUnmappedMemory) {
    uint8_t *p = Map(3, PROT_READ | PROT_WRITE);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(munmap(p + kPage, kPage), 0); // a hole in the middle
    auto hole = Check(U(p), 3 * kPage, OTE_VM_READ);
    EXPECT_EQ(hole.verdict, OTE_VM_UNMAPPED);
    EXPECT_EQ(hole.at, U(p) + kPage);
    EXPECT_STREQ(hole.what, "");
    ASSERT_EQ(munmap(p + 2 * kPage, kPage), 0);
    // Mapped first page, unmapped after it.
    auto tail = Check(U(p) + kPage - 8, 16, OTE_VM_READ);
    EXPECT_EQ(tail.verdict, OTE_VM_UNMAPPED);
    EXPECT_EQ(tail.at, U(p) + kPage);
    // Entirely unmapped.
    auto none = Check(U(p) + kPage, kPage, OTE_VM_READ);
    EXPECT_EQ(none.verdict, OTE_VM_UNMAPPED);
    EXPECT_EQ(none.at, U(p) + kPage);
    munmap(p, kPage);
    // Address 0 and the top of the address space are never mapped for us.
    EXPECT_EQ(Check(0, 64, OTE_VM_READ).verdict, OTE_VM_UNMAPPED);
    EXPECT_EQ(Check(UINT64_MAX - kPage, kPage, OTE_VM_READ).verdict, OTE_VM_UNMAPPED);
}

TEST_F(VmTest, FileShorterThanItsMappingIsPastEof) {
    char path[] = "/tmp/ote_vm_test_XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    unlink(path);
    // 1.5 pages of file under a 4-page mapping: page 2 and 3 lie past the end (SIGBUS).
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kPage + kPage / 2)), 0);
    void *m = mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    uint8_t *p = static_cast<uint8_t *>(m);
    auto whole = Check(U(p), 4 * kPage, OTE_VM_READ | OTE_VM_WRITE);
    EXPECT_EQ(whole.verdict, OTE_VM_PAST_EOF);
    EXPECT_EQ(whole.at, U(p) + 2 * kPage); // the first page with no file under it
    EXPECT_EQ(std::string(whole.what).substr(0, 4), "rw-s");
    // Within the file's pages (the partial page is whole in the page cache): fine.
    EXPECT_EQ(Check(U(p), 2 * kPage, OTE_VM_READ | OTE_VM_WRITE).verdict, OTE_VM_OK);
    // Starting past the end.
    auto late = Check(U(p) + 3 * kPage + 5, 7, OTE_VM_READ);
    EXPECT_EQ(late.verdict, OTE_VM_PAST_EOF);
    EXPECT_EQ(late.at, U(p) + 3 * kPage + 5);
    // Grown back: the same mapping is fine again.
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(4 * kPage)), 0);
    EXPECT_EQ(Check(U(p), 4 * kPage, OTE_VM_WRITE).verdict, OTE_VM_OK);
    munmap(m, 4 * kPage);
    close(fd);
}

TEST_F(VmTest, TruncatedMemfdAndReadOnlyFileMapping) {
    int fd = memfd_create("ote_vm_test", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(8 * kPage)), 0);
    void *m = mmap(nullptr, 8 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    uint8_t *p = static_cast<uint8_t *>(m);
    EXPECT_EQ(Check(U(p), 8 * kPage, OTE_VM_WRITE).verdict, OTE_VM_OK);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(5 * kPage)), 0);
    auto r = Check(U(p), 8 * kPage, OTE_VM_READ);
    EXPECT_EQ(r.verdict, OTE_VM_PAST_EOF);
    EXPECT_EQ(r.at, U(p) + 5 * kPage);
    munmap(m, 8 * kPage);
    // A file mapped read-only: READ yes, WRITE no.
    void *ro = mmap(nullptr, 5 * kPage, PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(ro, MAP_FAILED);
    auto rr = Check(U(ro), 5 * kPage, OTE_VM_READ);
    EXPECT_EQ(rr.verdict, OTE_VM_OK);
    EXPECT_EQ(rr.prot, OTE_VM_READ);
    EXPECT_EQ(Check(U(ro), 5 * kPage, OTE_VM_WRITE).verdict, OTE_VM_NO_ACCESS);
    munmap(ro, 5 * kPage);
    close(fd);
}

TEST_F(VmTest, WithoutProcEveryPageIsReadOnce) {
    ASSERT_EQ(ote_fault_arm("vm.maps_open", OTE_FAULT_EVERY, 0, OTE_ERR_FAULT, 0), OTE_OK);
    uint8_t *p = Map(4, PROT_READ | PROT_WRITE);
    ASSERT_NE(p, nullptr);
    auto ok = Check(U(p), 4 * kPage, OTE_VM_READ | OTE_VM_WRITE);
    EXPECT_EQ(ok.verdict, OTE_VM_OK);
    ASSERT_EQ(mprotect(p + 3 * kPage, kPage, PROT_NONE), 0);
    auto none = Check(U(p) + 1, 4 * kPage - 1, OTE_VM_READ);
    EXPECT_EQ(none.verdict, OTE_VM_NO_ACCESS);
    EXPECT_EQ(none.at, U(p) + 3 * kPage);
    EXPECT_GE(ote_fault_hits("vm.maps_open"), 2u);
    munmap(p, 4 * kPage);
}

TEST_F(VmTest, ManyMappingsAreScannedAcrossReadBuffers) {
    // More lines than one read of the maps text holds: every one of 400 pages of
    // alternating protection must be seen, the last one included.
    const size_t n = 400;
    uint8_t *p = Map(n, PROT_READ | PROT_WRITE);
    ASSERT_NE(p, nullptr);
    for (size_t i = 1; i < n; i += 2) ASSERT_EQ(mprotect(p + i * kPage, kPage, PROT_READ), 0);
    auto r = Check(U(p), n * kPage, OTE_VM_READ);
    EXPECT_EQ(r.verdict, OTE_VM_OK);
    EXPECT_EQ(r.prot, OTE_VM_READ);
    ASSERT_EQ(mprotect(p + (n - 1) * kPage, kPage, PROT_NONE), 0);
    auto last = Check(U(p), n * kPage, OTE_VM_READ);
    EXPECT_EQ(last.verdict, OTE_VM_NO_ACCESS);
    EXPECT_EQ(last.at, U(p) + (n - 1) * kPage);
    munmap(p, n * kPage);
}

} // namespace
