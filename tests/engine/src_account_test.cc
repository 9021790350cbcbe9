// The source's account of a request (engine/src_account.h), as a unit: created once per
// (scope, id) up to what the caller allows, the first piece opens it (its check's status
// then answers every piece), pieces that name another request are refused without a
// change, held and seen bytes end it exactly at the last byte (never before), a cancel
// answers later pieces, a scope's end ends what nothing holds (or everything, at a
// teardown), and pins held alone are told apart from accounts.
#include <gtest/gtest.h>

#include <vector>

#include "tests/util/test_base.h"

extern "C" {
#include "engine/src_account.h"
}

namespace {

class SrcAccountTest : public ote_test::OteTest {
  protected:
    void TearDown() override {
        ote__acct_t *ended = nullptr;
        ote__acct_end_scope(&set_, 0, 1, 1, Collect, &ended);
        while (ended != nullptr) {
            ote__acct_t *next = ended->link;
            ote__acct_free(ended);
            ended = next;
        }
        EXPECT_EQ(set_.n, 0u);
        OteTest::TearDown();
    }
    static void Collect(void *arg, ote__acct_t *a) {
        auto **head = static_cast<ote__acct_t **>(arg);
        a->link = *head;
        *head = a;
    }
    ote__acct_t *Get(uint64_t scope, uint64_t uid, uint64_t len, int may = 1) {
        int created = 0;
        return ote__acct_get(&set_, scope, uid, len, may, &created);
    }
    ote__acct_set_t set_{};
    int pin_ = 0; // an engine pin's address
};

TEST_F(SrcAccountTest, OneAccountPerScopeAndIdUpToWhatTheCallerAllows) {
    int created = 0;
    ote__acct_t *a = ote__acct_get(&set_, 1, 7, 100, 1, &created);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(created, 1);
    EXPECT_EQ(ote__acct_get(&set_, 1, 7, 100, 1, &created), a);
    EXPECT_EQ(created, 0);
    ote__acct_t *b = ote__acct_get(&set_, 2, 7, 100, 1, &created); // another scope
    ASSERT_NE(b, nullptr);
    EXPECT_NE(b, a);
    EXPECT_EQ(ote__acct_get(&set_, 3, 7, 100, 0, &created), nullptr); // at the cap
    EXPECT_EQ(ote__acct_get(&set_, 1, 7, 100, 0, &created), a);       // found all the same
    EXPECT_EQ(ote__acct_find(&set_, 2, 7), b);
    EXPECT_EQ(ote__acct_find(&set_, 2, 8), nullptr);
    EXPECT_EQ(set_.n, 2u);
}

TEST_F(SrcAccountTest, TheFirstPieceOpensAndItsStatusAnswersEveryPiece) {
    ote__acct_t *a = Get(1, 1, 300);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 300, 2, 100, &first), OTE_OK);
    EXPECT_EQ(first, 1);
    ote__acct_open(a, OTE_ERR_ACCESS, &pin_); // refused: no pin kept
    EXPECT_EQ(a->pin, nullptr);
    EXPECT_EQ(ote__acct_hold(a, 100), OTE_ERR_ACCESS);
    EXPECT_EQ(ote__acct_settle(&set_, a, 100, 0), nullptr); // 200 bytes still to come
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 300, 2, 100, &first), OTE_OK);
    EXPECT_EQ(first, 0);
    EXPECT_EQ(ote__acct_hold(a, 100), OTE_ERR_ACCESS);
    EXPECT_EQ(ote__acct_settle(&set_, a, 100, 0), nullptr);
    EXPECT_EQ(ote__acct_hold(a, 100), OTE_ERR_ACCESS);
    ote__acct_t *end = ote__acct_settle(&set_, a, 100, 0); // the last byte
    ASSERT_EQ(end, a);
    EXPECT_EQ(set_.n, 0u);
    ote__acct_free(end);
}

TEST_F(SrcAccountTest, PiecesOfAnotherRequestAreRefusedWithoutAChange) {
    ote__acct_t *a = Get(1, 1, 300);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 300, 2, 100, &first), OTE_OK);
    ote__acct_open(a, OTE_OK, &pin_);
    ASSERT_EQ(ote__acct_hold(a, 100), OTE_OK);
    EXPECT_EQ(ote__acct_admit(a, 0x2000, 300, 2, 100, &first), OTE_ERR_INVALID); // address
    EXPECT_EQ(ote__acct_admit(a, 0x1000, 301, 2, 100, &first), OTE_ERR_INVALID); // length
    EXPECT_EQ(ote__acct_admit(a, 0x1000, 300, 1, 100, &first), OTE_ERR_INVALID); // op
    EXPECT_EQ(ote__acct_admit(a, 0x1000, 300, 2, 201, &first), OTE_ERR_INVALID); // > left
    EXPECT_EQ(a->left, 200u);
    EXPECT_EQ(a->held, 100u);
    // An address set at creation (a transport whose write-offs name one) binds too.
    ote__acct_t *b = Get(1, 2, 50);
    b->req_addr = 0x3000;
    EXPECT_EQ(ote__acct_admit(b, 0x4000, 50, 2, 50, &first), OTE_ERR_INVALID);
    EXPECT_EQ(ote__acct_admit(b, 0x3000, 50, 2, 50, &first), OTE_OK);
    EXPECT_EQ(first, 1);
}

TEST_F(SrcAccountTest, HeldAndSeenBytesEndItExactlyAtTheLastByte) {
    ote__acct_t *a = Get(1, 1, 300);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 300, 2, 100, &first), OTE_OK);
    ote__acct_open(a, OTE_OK, &pin_);
    ASSERT_EQ(ote__acct_hold(a, 100), OTE_OK);
    ASSERT_EQ(ote__acct_hold(a, 100), OTE_OK);
    EXPECT_EQ(ote__acct_settle(&set_, a, 100, 0), nullptr); // the third written off
    EXPECT_EQ(ote__acct_settle(&set_, a, 0, 100), nullptr); // one piece served
    EXPECT_EQ(ote__acct_settle(&set_, a, 0, 1000), a);      // the last (clamped)
    EXPECT_EQ(a->pin, &pin_);                               // the caller releases it
    ote__acct_free(a);
    // A write-off before any piece: the account waits for the rest.
    ote__acct_t *b = Get(1, 2, 64);
    EXPECT_EQ(ote__acct_settle(&set_, b, 32, 0), nullptr);
    EXPECT_EQ(b->opened, 0);
}

// A piece being staged (its copy runs outside the caller's lock, and the copy's end uses
// the account): a write-off of the whole request, or its scope's end, does not end the
// account; the unstage does, once nothing else is left or held.
TEST_F(SrcAccountTest, AStagingPieceKeepsItUntilItsUnstage) {
    ote__acct_t *a = Get(1, 1, 200);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 200, 2, 100, &first), OTE_OK);
    ote__acct_open(a, OTE_OK, &pin_);
    ote__acct_stage(a, 100);
    EXPECT_EQ(ote__acct_settle(&set_, a, 200, 0), nullptr); // all written off: staging
    ote__acct_t *ended = nullptr;
    EXPECT_EQ(ote__acct_end_scope(&set_, 1, 0, 1, Collect, &ended), 0u); // not even teardown
    EXPECT_EQ(ote__acct_find(&set_, 1, 1), a);
    EXPECT_EQ(ote__acct_unstage(&set_, a, 100), a); // its copy ended: now it goes
    EXPECT_EQ(ote__acct_find(&set_, 1, 1), nullptr);
    ote__acct_free(a);
    // Staged, then held by its serve: the unstage leaves it to the held piece.
    ote__acct_t *b = Get(1, 2, 100);
    ASSERT_EQ(ote__acct_admit(b, 0x2000, 100, 2, 100, &first), OTE_OK);
    ote__acct_open(b, OTE_OK, &pin_);
    ote__acct_stage(b, 100);
    ASSERT_EQ(ote__acct_hold(b, 100), OTE_OK);
    EXPECT_EQ(ote__acct_unstage(&set_, b, 100), nullptr);
    EXPECT_EQ(ote__acct_settle(&set_, b, 0, 100), b);
    ote__acct_free(b);
}

TEST_F(SrcAccountTest, ACancelAnswersLaterPieces) {
    ote__acct_t *a = Get(1, 1, 200);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 200, 2, 100, &first), OTE_OK);
    ote__acct_open(a, OTE_OK, &pin_);
    ASSERT_EQ(ote__acct_hold(a, 100), OTE_OK);
    ote__acct_cancel(a);
    EXPECT_EQ(ote__acct_hold(a, 100), OTE_ERR_CANCELED);
    EXPECT_EQ(a->held, 100u);
}

TEST_F(SrcAccountTest, AScopesEndEndsWhatNothingHoldsOrEverythingAtTeardown) {
    ote__acct_t *a = Get(1, 1, 100), *b = Get(1, 2, 100), *c = Get(2, 1, 100);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 100, 2, 100, &first), OTE_OK);
    ote__acct_open(a, OTE_OK, &pin_);
    ASSERT_EQ(ote__acct_hold(a, 100), OTE_OK); // a is held: it ends with its piece
    ote__acct_t *ended = nullptr;
    EXPECT_EQ(ote__acct_end_scope(&set_, 1, 0, 0, Collect, &ended), 1u);
    EXPECT_EQ(ended, b);
    ote__acct_free(b);
    EXPECT_EQ(ote__acct_find(&set_, 2, 1), c); // another scope is untouched
    EXPECT_EQ(ote__acct_settle(&set_, a, 0, 100), a);
    ote__acct_free(a);
    ended = nullptr;
    EXPECT_EQ(ote__acct_end_scope(&set_, 0, 1, 1, Collect, &ended), 1u);
    EXPECT_EQ(ended, c);
    ote__acct_free(c);
    EXPECT_EQ(set_.n, 0u);
}

ote_status_t FakePin(void *arg, uint64_t, uint64_t, unsigned, void **pin_out) {
    *pin_out = arg;
    return OTE_OK;
}

TEST_F(SrcAccountTest, PinsHeldAloneAreToldApartFromAccounts) {
    alignas(8) static int engine_pin;
    void *pin = nullptr;
    ASSERT_EQ(ote__acct_pin_alone(FakePin, &engine_pin, 0x1000, 10, 1, &pin), OTE_OK);
    EXPECT_TRUE(ote__acct_is_alone(pin));
    EXPECT_EQ(ote__acct_alone_pin(pin), &engine_pin);
    EXPECT_EQ(ote__acct_engine_pin(pin), &engine_pin);
    ote__acct_t *a = Get(1, 1, 10);
    int first = 0;
    ASSERT_EQ(ote__acct_admit(a, 0x1000, 10, 2, 10, &first), OTE_OK);
    ote__acct_open(a, OTE_OK, &engine_pin);
    EXPECT_FALSE(ote__acct_is_alone(a));
    EXPECT_EQ(ote__acct_engine_pin(a), &engine_pin);
}

} // namespace
