// Small utilities that guard the daemons' files: safe names, private directories,
// resolved path roots, writes that do not follow links.
#include "common/util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/spec/job_spec.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/tessera-util-XXXXXX";
    path_ = mkdtemp(t);
  }
  ~TempDir() { (void)system(("rm -rf " + path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Util, SafeNamesAreOnePathComponent) {
  for (const char* ok : {"n0", "node-1.example", "job_a-3f2a1c", "A"}) EXPECT_TRUE(IsSafeName(ok)) << ok;
  for (const char* bad : {"", ".", "..", "../etc", "a/b", "-x", ".hidden", "a b", "x\n"}) EXPECT_FALSE(IsSafeName(bad)) << bad;
  EXPECT_FALSE(IsSafeName(std::string(254, 'a')));
  EXPECT_TRUE(IsSafeName(std::string(63, 'a'), 63));
  EXPECT_FALSE(IsSafeName(std::string(64, 'a'), 63));
}

TEST(Util, APrivateDirectoryIsTightenedOrRefused) {
  TempDir t;
  const std::string d = t.path() + "/state";
  ASSERT_EQ(mkdir(d.c_str(), 0755), 0);
  auto r = TightenPrivateDir(d, "--state-dir");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*r);
  struct stat st {};
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_FALSE(*TightenPrivateDir(d, "--state-dir"));  // already private
  EXPECT_THAT(std::string(TightenPrivateDir(t.path() + "/none", "--state-dir").status().message()),
              HasSubstr("--state-dir"));
  if (geteuid() == 0) {  // a directory of another user: refused (root can make one)
    const std::string other = t.path() + "/other";
    ASSERT_EQ(mkdir(other.c_str(), 0700), 0);
    ASSERT_EQ(chown(other.c_str(), 65534, 65534), 0);
    auto o = TightenPrivateDir(other, "--state-dir");
    EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(o.status().message()), HasSubstr("belongs to uid 65534"));
  }
}

// A symbolic link under a root that leads out of it passes the lexical check at submit;
// the check where files are opened resolves it and refuses it by field.
TEST(Util, PathRootsHoldWithSymlinksResolved) {
  TempDir t;
  const std::string root = t.path() + "/root", outside = t.path() + "/outside";
  ASSERT_EQ(mkdir(root.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(outside.c_str(), 0700), 0);
  ASSERT_EQ(symlink(outside.c_str(), (root + "/escape").c_str()), 0);
  ASSERT_EQ(mkdir((root + "/in").c_str(), 0700), 0);
  v1::JobSpec spec;
  spec.mutable_generate()->set_input(root + "/in/prompts.jsonl");
  spec.mutable_generate()->set_output(root + "/escape/out.jsonl");
  EXPECT_TRUE(CheckJobPaths(spec, {root}).ok());  // lexically inside
  auto st = CheckJobPathsResolved(spec, {root});
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(st.message()), HasSubstr("generate.output: '" + root + "/escape/out.jsonl' resolves to '" +
                                                   outside + "/out.jsonl'"));
  spec.mutable_generate()->set_output(root + "/in/new/dir/out.jsonl");  // not there yet: as written under the root
  EXPECT_TRUE(CheckJobPathsResolved(spec, {root}).ok()) << CheckJobPathsResolved(spec, {root});
  // A root that is itself a link is taken where it leads.
  ASSERT_EQ(symlink(root.c_str(), (t.path() + "/root-link").c_str()), 0);
  EXPECT_TRUE(CheckJobPathsResolved(spec, {t.path() + "/root-link"}).ok());
  // WriteFileAtomic does not write through a link planted at its temporary name.
  const std::string target = root + "/in/target", victim = outside + "/victim";
  ASSERT_TRUE(WriteFileAtomic(victim, "keep").ok());
  ASSERT_EQ(symlink(victim.c_str(), (target + ".tmp." + std::to_string(getpid())).c_str()), 0);
  EXPECT_FALSE(WriteFileAtomic(target, "evil").ok());
  EXPECT_EQ(*ReadFile(victim), "keep");
}

}  // namespace
}  // namespace tessera
