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

}  // namespace
}  // namespace tessera::controller
