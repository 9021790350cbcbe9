// Notifications are never lost silently (issue 27): a batch notification that meets a
// full receiver queue is sent again until room comes (then it arrives, after everything
// queued before it) or until its deadline (then ote_batch_notify_result says
// OTE_ERR_AGAIN, the data requests keeping their own status); one not sent because a
// request to its segment failed says OTE_ERR_CANCELED. Over shm (the default for a peer
// on this host) and tcp.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/engine/engine_util.h"
#include "tests/util/test_base.h"

extern "C" {
#include "base/time.h"
#include "ote/ote.h"
}

namespace {

using ote_test::EngineAddress;
using ote_test::kMs;
using ote_test::kSec;
using ote_test::NewEngine;

class NotifyTest : public ote_test::OteTest, public ::testing::WithParamInterface<const char *> {
  protected:
    // The receiver's queue filled with small messages until the sender sees AGAIN;
    // returns how many were queued.
    static size_t Fill(ote_engine_t *a, ote_segment_t *seg) {
        size_t n = 0;
        while (ote_notify_send(a, seg, "f", 1) == OTE_OK && n < 100000) n++;
        return n;
    }
    // A batch with one zero-length request to seg (completes at once) and `msg` attached.
    static ote_batch_t *NotifyingBatch(ote_engine_t *a, ote_segment_t *seg, const char *msg) {
        ote_batch_t *bt = nullptr;
        EXPECT_EQ(ote_batch_create(a, 1, &bt), OTE_OK);
        ote_request_t zero = {OTE_WRITE, nullptr, seg, 0, 0};
        EXPECT_EQ(ote_batch_notify(bt, seg, msg, strlen(msg)), OTE_OK);
        EXPECT_EQ(ote_batch_submit(bt, &zero, 1), OTE_OK);
        return bt;
    }
};

// The queue is full when the batch's notification goes out; a reader drains it 300 ms
// later: the notification arrives after the 1,024 queued before it, the batch's wait
// returns OK only then, and its result is OK.
TEST_P(NotifyTest, BatchNotificationWaitsForRoomThenArrives) {
    ote_engine_t *a = NewEngine({{"transports", GetParam()}});
    ote_engine_t *b = NewEngine({{"transports", GetParam()}});
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, EngineAddress(b).c_str(), &seg), OTE_OK);
    const size_t queued = Fill(a, seg);
    EXPECT_EQ(queued, static_cast<size_t>(OTE_NOTIFY_QUEUE_MAX));
    ote_batch_t *bt = NotifyingBatch(a, seg, "late");
    std::vector<std::string> got;
    std::thread reader([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        char buf[OTE_NOTIFY_MAX];
        size_t len = 0;
        while (got.size() < queued + 1 &&
               ote_notify_recv(b, buf, sizeof(buf), &len, nullptr, 0, 20 * kSec) == OTE_OK)
            got.emplace_back(buf, len);
    });
    EXPECT_EQ(ote_batch_wait(bt, 60 * kSec), OTE_OK);
    ote_status_t res = OTE_ERR_FAULT;
    ASSERT_EQ(ote_batch_notify_result(bt, &res), OTE_OK);
    EXPECT_EQ(res, OTE_OK);
    reader.join();
    ASSERT_EQ(got.size(), queued + 1);
    EXPECT_EQ(got.back(), "late");
    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

// Nobody drains: the notification fails at its deadline (transfer_timeout_ms, 400 ms)
// with OTE_ERR_AGAIN as its result while the batch's data request completed; it never
// arrives afterwards, and the segment closes.
TEST_P(NotifyTest, BatchNotificationFailsVisiblyAtItsDeadline) {
    ote_engine_t *a = NewEngine({{"transports", GetParam()}, {"transfer_timeout_ms", "400"}});
    ote_engine_t *b = NewEngine({{"transports", GetParam()}});
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, EngineAddress(b).c_str(), &seg), OTE_OK);
    const size_t queued = Fill(a, seg);
    ote_batch_t *bt = NotifyingBatch(a, seg, "never");
    EXPECT_EQ(ote_batch_wait(bt, 60 * kSec), OTE_OK); // the data request completed
    ote_status_t res = OTE_OK;
    ASSERT_EQ(ote_batch_notify_result(bt, &res), OTE_OK);
    // Refused to the end (AGAIN); TIMEOUT only if its last send got no answer in time, when
    // it may still be queued there (as for ote_notify_send).
    EXPECT_TRUE(ote_status_code(res) == OTE_ERR_AGAIN || ote_status_code(res) == OTE_ERR_TIMEOUT)
        << ote_status_str(res);
    ote_transfer_status_t ts;
    ASSERT_EQ(ote_batch_status(bt, 0, &ts), OTE_OK);
    EXPECT_EQ(ts.state, OTE_TRANSFER_COMPLETED);
    size_t len = 0;
    for (size_t i = 0; i < queued; i++) ASSERT_EQ(ote_notify_discard(b, &len), OTE_OK) << i;
    char buf[16];
    if (ote_status_code(res) == OTE_ERR_AGAIN) {
        EXPECT_EQ(ote_notify_recv(b, buf, sizeof(buf), &len, nullptr, 0, 300 * kMs),
                  OTE_ERR_TIMEOUT);
    }
    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

// A request to the segment fails (no registration there): the notification is not sent,
// and the result says so (CANCELED) while the request keeps ACCESS; a reset forgets it.
TEST_P(NotifyTest, NotSentAfterAFailedRequestIsCanceled) {
    ote_engine_t *a = NewEngine({{"transports", GetParam()}});
    ote_engine_t *b = NewEngine({{"transports", GetParam()}});
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, EngineAddress(b).c_str(), &seg), OTE_OK);
    std::vector<char> buf(4096, 1);
    ote_batch_t *bt = nullptr;
    ASSERT_EQ(ote_batch_create(a, 1, &bt), OTE_OK);
    ote_status_t res = OTE_ERR_FAULT;
    ASSERT_EQ(ote_batch_notify(bt, seg, "x", 1), OTE_OK);
    ASSERT_EQ(ote_batch_notify_result(bt, &res), OTE_OK);
    EXPECT_EQ(res, OTE_ERR_AGAIN) << "undecided";
    ote_request_t r = {OTE_WRITE, buf.data(), seg, 4096, buf.size()};
    ASSERT_EQ(ote_batch_submit(bt, &r, 1), OTE_OK);
    EXPECT_EQ(ote_status_code(ote_batch_wait(bt, 60 * kSec)), OTE_ERR_ACCESS);
    ASSERT_EQ(ote_batch_notify_result(bt, &res), OTE_OK);
    EXPECT_EQ(res, OTE_ERR_CANCELED);
    EXPECT_EQ(ote_batch_notify_result(nullptr, &res), OTE_ERR_INVALID);
    EXPECT_EQ(ote_batch_notify_result(bt, nullptr), OTE_ERR_INVALID);
    ASSERT_EQ(ote_batch_reset(bt), OTE_OK);
    ASSERT_EQ(ote_batch_notify_result(bt, &res), OTE_OK);
    EXPECT_EQ(res, OTE_OK);
    EXPECT_EQ(ote_batch_destroy(bt), OTE_OK);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

// ote_notify_drain takes every queued message at once, in order, with its sender, as far
// as the records and the data buffer allow; a message longer than the data buffer is
// TOO_BIG with nothing taken; an empty queue gives 0.
TEST_P(NotifyTest, DrainTakesEveryQueuedMessageInOrder) {
    ote_engine_t *a = NewEngine({{"transports", GetParam()}});
    ote_engine_t *b = NewEngine({{"transports", GetParam()}});
    ote_segment_t *seg = nullptr;
    ASSERT_EQ(ote_segment_open(a, EngineAddress(b).c_str(), &seg), OTE_OK);
    for (int i = 0; i < 10; i++) {
        std::string m = "message " + std::to_string(i) + std::string(i * 10, 'x');
        ASSERT_EQ(ote_notify_send(a, seg, m.data(), m.size()), OTE_OK);
    }
    ote_notification_t rec[4];
    std::vector<char> data(1 << 12);
    size_t n = 99;
    char tiny[4];
    EXPECT_EQ(ote_notify_drain(b, rec, 4, tiny, sizeof(tiny), &n), OTE_ERR_TOO_BIG);
    EXPECT_EQ(n, 99u);
    std::vector<std::string> got;
    do {
        ASSERT_EQ(ote_notify_drain(b, rec, 4, data.data(), data.size(), &n), OTE_OK);
        ASSERT_LE(n, 4u);
        for (size_t i = 0; i < n; i++) {
            EXPECT_STREQ(rec[i].from, EngineAddress(a).c_str());
            got.emplace_back(data.data() + rec[i].offset, rec[i].len);
        }
    } while (n > 0);
    ASSERT_EQ(got.size(), 10u);
    for (int i = 0; i < 10; i++)
        EXPECT_EQ(got[i], "message " + std::to_string(i) + std::string(i * 10, 'x'));
    EXPECT_EQ(ote_notify_drain(b, nullptr, 0, nullptr, 0, &n), OTE_OK);
    EXPECT_EQ(n, 0u);
    EXPECT_EQ(ote_notify_drain(b, rec, 4, nullptr, 16, &n), OTE_ERR_INVALID);
    EXPECT_EQ(ote_segment_close(seg), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(a), OTE_OK);
    EXPECT_EQ(ote_engine_destroy(b), OTE_OK);
}

INSTANTIATE_TEST_SUITE_P(Transports, NotifyTest, ::testing::Values("shm,tcp", "tcp"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param[0] == 's' ? "shm" : "tcp");
                         });

} // namespace
