#include "controller/store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "common/util.h"

namespace tessera::controller {
namespace {

TEST(Store, SurvivesReopen) {
  std::string dir = "/tmp/tessera-store-test-" + RandomHex(4);
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string path = dir + "/state.db";
  {
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    v1::Job j;
    j.set_job_id("a");
    j.set_submission_id("sub-1");
    j.set_state(v1::JOB_STATE_PENDING);
    j.set_created_ms(1);
    ASSERT_TRUE((*s)->PutJob(j).ok());
    j.set_state(v1::JOB_STATE_RUNNING);
    j.set_attempt(2);
    ASSERT_TRUE((*s)->PutJob(j).ok());
    v1::Job k;
    k.set_job_id("b");
    k.set_created_ms(2);
    ASSERT_TRUE((*s)->PutJob(k).ok());
    ASSERT_TRUE((*s)->PutNodeIncarnation("n1", 7).ok());
  }
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  auto jobs = (*s)->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].job_id(), "a");
  EXPECT_EQ((*jobs)[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ((*jobs)[0].attempt(), 2);
  EXPECT_EQ((*(*s)->LoadNodeIncarnations())["n1"], 7);
  // A second job with the same submission id is refused by the unique index.
  v1::Job dup;
  dup.set_job_id("c");
  dup.set_submission_id("sub-1");
  EXPECT_FALSE((*s)->PutJob(dup).ok());
  system(("rm -rf " + dir).c_str());
}

// Events are kept per job in order, read in pages after a seq, and survive a reopen with
// the database's id.
TEST(Store, KeepsEventsAndItsIdAcrossReopen) {
  std::string dir = "/tmp/tessera-store-test-" + RandomHex(4);
  ASSERT_TRUE(MakeDirs(dir).ok());
  std::string path = dir + "/state.db", id;
  {
    auto s = Store::Open(path);
    ASSERT_TRUE(s.ok()) << s.status();
    id = (*s)->id();
    EXPECT_EQ(id.size(), 16u);
    for (int64_t i = 1; i <= 7; ++i) {
      v1::JobEvent e;
      e.set_seq(i);
      e.mutable_progress()->set_step(10 * i);
      ASSERT_TRUE((*s)->PutEvent("a", e).ok());
      if (i <= 2) ASSERT_TRUE((*s)->PutEvent("b", e).ok());
    }
    v1::JobEvent again;
    again.set_seq(3);
    EXPECT_FALSE((*s)->PutEvent("a", again).ok());  // a seq is written once
  }
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->id(), id);
  EXPECT_EQ(*(*s)->LastEventSeq("a"), 7);
  EXPECT_EQ(*(*s)->LastEventSeq("b"), 2);
  EXPECT_EQ(*(*s)->LastEventSeq("none"), 0);
  auto page = (*s)->LoadEvents("a", 2, 3);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->size(), 3u);
  EXPECT_EQ((*page)[0].seq(), 3);
  EXPECT_EQ((*page)[2].progress().step(), 50);
  EXPECT_EQ((*s)->LoadEvents("a", 7, 10)->size(), 0u);
  auto other = Store::Open(dir + "/other.db");
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)->id(), id);
  system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace tessera::controller
