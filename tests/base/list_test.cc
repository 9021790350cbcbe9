// Unit tests of base/list.h, the one parser of separated lists: the grammar (empty
// list, empty items, no trimming, no case folding), membership, names matched at most
// once, and items cut out of a writable list.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "base/list.h"
}

namespace {

using ote_test::OteTest;

class ListTest : public OteTest {};

std::vector<std::string> Items(const char *list, char sep = ',') {
    std::vector<std::string> out;
    ote_list_iter_t it = ote_list_iter(list, sep);
    const char *item = nullptr;
    size_t len = 0;
    while (ote_list_next(&it, &item, &len)) out.emplace_back(item, len);
    return out;
}

using V = std::vector<std::string>;

TEST_F(ListTest, ItemsIncludeEmptyOnesAndAreNotTrimmed) {
    EXPECT_EQ(Items(nullptr), V{});
    EXPECT_EQ(Items(""), V{});
    EXPECT_EQ(Items("tcp"), V{"tcp"});
    EXPECT_EQ(Items("shm,tcp"), (V{"shm", "tcp"}));
    EXPECT_EQ(Items(","), (V{"", ""}));
    EXPECT_EQ(Items("a,"), (V{"a", ""}));
    EXPECT_EQ(Items(",a"), (V{"", "a"}));
    EXPECT_EQ(Items("a,,b"), (V{"a", "", "b"}));
    EXPECT_EQ(Items(" a , b "), (V{" a ", " b "}));
    EXPECT_EQ(Items("k=v;x=y", ';'), (V{"k=v", "x=y"}));
    EXPECT_EQ(Items("k=v,w;x", ';'), (V{"k=v,w", "x"}));
}

TEST_F(ListTest, NextAfterTheLastItemLeavesOutputsAlone) {
    ote_list_iter_t it = ote_list_iter("x", ',');
    const char *item = nullptr;
    size_t len = 0;
    ASSERT_TRUE(ote_list_next(&it, &item, &len));
    const char *kept = item;
    EXPECT_FALSE(ote_list_next(&it, &item, &len));
    EXPECT_FALSE(ote_list_next(&it, &item, &len));
    EXPECT_EQ(item, kept);
    EXPECT_EQ(len, 1u);
    EXPECT_FALSE(ote_list_next(nullptr, &item, &len));
}

TEST_F(ListTest, ItemIsComparesExactly) {
    EXPECT_TRUE(ote_list_item_is("tcp,x", 3, "tcp"));
    EXPECT_FALSE(ote_list_item_is("tcp,x", 2, "tcp"));
    EXPECT_FALSE(ote_list_item_is("tcpx", 4, "tcp"));
    EXPECT_FALSE(ote_list_item_is("TCP", 3, "tcp"));
    EXPECT_TRUE(ote_list_item_is("", 0, ""));
}

TEST_F(ListTest, HasIsExactMembership) {
    EXPECT_TRUE(ote_list_has("shm,tcp", "tcp"));
    EXPECT_TRUE(ote_list_has("shm,tcp", "shm"));
    EXPECT_FALSE(ote_list_has("shm,tcp", "rdma"));
    EXPECT_FALSE(ote_list_has("shm,tcp", "tc"));
    EXPECT_FALSE(ote_list_has("shm,tcpx", "tcp"));
    EXPECT_FALSE(ote_list_has("shm, tcp", "tcp")); // no trimming
    EXPECT_FALSE(ote_list_has("SHM", "shm"));      // no case folding
    EXPECT_TRUE(ote_list_has("tcp,,shm", "shm"));
    EXPECT_FALSE(ote_list_has("", "tcp"));
    EXPECT_FALSE(ote_list_has(nullptr, "tcp"));
    EXPECT_FALSE(ote_list_has("tcp", nullptr));
}

TEST_F(ListTest, MatchGivesAMaskOfDistinctKnownNames) {
    static const char *const names[] = {"staging", "ipc", "direct"};
    unsigned mask = 99;
    ASSERT_EQ(ote_list_match("", names, 3, &mask), OTE_OK);
    EXPECT_EQ(mask, 0u);
    ASSERT_EQ(ote_list_match("ipc", names, 3, &mask), OTE_OK);
    EXPECT_EQ(mask, 2u);
    ASSERT_EQ(ote_list_match("direct,staging,ipc", names, 3, &mask), OTE_OK);
    EXPECT_EQ(mask, 7u);
    for (const char *bad : {"ipc,ipc", "ipc,", ",ipc", "ipc,,staging", "IPC", " ipc", "ipc ", "gpu",
                            "staging,ipc,direct,staging"}) {
        mask = 99;
        EXPECT_EQ(ote_list_match(bad, names, 3, &mask), OTE_ERR_INVALID) << bad;
        EXPECT_EQ(mask, 99u) << bad; // untouched on failure
    }
    EXPECT_EQ(ote_list_match(nullptr, names, 3, &mask), OTE_ERR_INVALID);
    EXPECT_EQ(ote_list_match("ipc", nullptr, 3, &mask), OTE_ERR_INVALID);
    EXPECT_EQ(ote_list_match("ipc", names, 3, nullptr), OTE_ERR_INVALID);
    EXPECT_EQ(ote_list_match("ipc", names, OTE_LIST_MAX_NAMES + 1, &mask), OTE_ERR_INVALID);
}

TEST_F(ListTest, MatchTellsThirtyTwoNamesApart) {
    std::vector<std::string> store;
    for (int i = 0; i < OTE_LIST_MAX_NAMES; i++) store.push_back("n" + std::to_string(i));
    std::vector<const char *> names;
    for (const auto &s : store) names.push_back(s.c_str());
    unsigned mask = 0;
    ASSERT_EQ(ote_list_match("n31,n0", names.data(), names.size(), &mask), OTE_OK);
    EXPECT_EQ(mask, 0x80000001u);
    EXPECT_EQ(ote_list_match("n31,n31", names.data(), names.size(), &mask), OTE_ERR_INVALID);
}

TEST_F(ListTest, CutTerminatesItemsOfAWritableList) {
    char buf[] = "ab,,c";
    std::vector<std::string> cut;
    ote_list_iter_t it = ote_list_iter(buf, ',');
    const char *item = nullptr;
    size_t len = 0;
    while (ote_list_next(&it, &item, &len)) {
        char *s = ote_list_cut(buf, item, len);
        EXPECT_EQ(s, buf + (item - buf));
        cut.emplace_back(s);
    }
    EXPECT_EQ(cut, (V{"ab", "", "c"})); // the walk went on past each overwritten separator
    EXPECT_EQ(std::string(buf, sizeof(buf) - 1), std::string("ab\0\0c", 5));
}

} // namespace
