// deploy/k8s, checked offline: each overlay is rendered as `kubectl kustomize` renders
// it (the subset of kustomize the manifests use: resources, namespace, labels, images,
// strategic-merge patches; anything else is refused, so the renderer cannot silently
// differ), and every object is linted:
//   - every key is known for its kind (tests/deploy/k8s_schema.yaml) and has the right
//     type (label and ConfigMap values are strings, ports are numbers);
//   - nvidia.com/gpu appears in a container's limits only (requests would be wrong or
//     redundant), and the worker asks for GPUs;
//   - each workload's selector matches its own pod template's labels, and every Service,
//     PodDisruptionBudget and NetworkPolicy selects some workload's pods;
//   - probes and Service target ports name ports the selected containers declare;
//   - volume mounts name volumes of the pod; ConfigMaps and claims exist in the render;
//     Secrets are the two the operator makes (docs/operations.md);
//   - namespaced objects are in the tessera namespace; images carry a tag, not latest.
// Where kubectl is installed, its `kubectl kustomize` output must equal ours.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_arch.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tessera::testing {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

const fs::path kK8s = fs::path(TESSERA_SOURCE_DIR) / "deploy/k8s";

std::string KeyOf(const YAML::Node& o) {
  return absl::StrCat(o["kind"].as<std::string>(""), "/", o["metadata"]["name"].as<std::string>(""));
}

bool NamedList(const YAML::Node& n) {
  if (!n.IsSequence() || n.size() == 0) return false;
  for (const auto& e : n)
    if (!e.IsMap() || !e["name"]) return false;
  return true;
}

// Strategic merge as kubectl applies it to the fields used here: maps merge key by key
// (null deletes, "$patch: replace" replaces), lists of named items merge by name,
// other lists and scalars are replaced.
YAML::Node Merge(const YAML::Node& base, const YAML::Node& patch) {
  if (patch.IsMap()) {
    if (patch["$patch"]) {
      YAML::Node out(YAML::NodeType::Map);
      for (const auto& kv : patch)
        if (kv.first.as<std::string>() != "$patch") out[kv.first.as<std::string>()] = YAML::Clone(kv.second);
      return out;
    }
    if (!base.IsMap()) return YAML::Clone(patch);
    YAML::Node out = YAML::Clone(base);
    for (const auto& kv : patch) {
      const std::string k = kv.first.as<std::string>();
      if (kv.second.IsNull()) out.remove(k);
      else if (out[k]) out[k] = Merge(out[k], kv.second);
      else out[k] = YAML::Clone(kv.second);
    }
    return out;
  }
  if (NamedList(patch) && NamedList(base)) {
    YAML::Node out = YAML::Clone(base);
    for (const auto& p : patch) {
      bool found = false;
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i]["name"].as<std::string>() == p["name"].as<std::string>()) out[i] = Merge(out[i], p), found = true;
      if (!found) out.push_back(YAML::Clone(p));
    }
    return out;
  }
  return YAML::Clone(patch);
}

std::vector<YAML::Node> PodSpecs(const YAML::Node& o) {
  const std::string kind = o["kind"].as<std::string>("");
  if (kind == "Deployment" || kind == "DaemonSet") return {o["spec"]["template"]["spec"]};
  return {};
}

absl::StatusOr<std::vector<YAML::Node>> Build(const fs::path& dir) {
  YAML::Node k;
  try {
    k = YAML::LoadFile((dir / "kustomization.yaml").string());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(dir.string(), "/kustomization.yaml: ", e.what()));
  }
  for (const auto& kv : k) {
    const std::string key = kv.first.as<std::string>();
    static const std::set<std::string> kKnown = {"apiVersion", "kind", "namespace", "labels", "resources", "patches", "images"};
    if (!kKnown.count(key))
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), "/kustomization.yaml: '", key,
                                                     "' is not supported by this renderer (extend it, and its kubectl check)"));
  }
  std::vector<YAML::Node> objs;
  for (const auto& r : k["resources"]) {
    const fs::path p = dir / r.as<std::string>();
    if (fs::is_directory(p)) {
      auto sub = Build(p);
      if (!sub.ok()) return sub.status();
      objs.insert(objs.end(), sub->begin(), sub->end());
    } else {
      try {
        for (const auto& d : YAML::LoadAllFromFile(p.string()))
          if (!d.IsNull()) objs.push_back(d);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(p.string(), ": ", e.what()));
      }
    }
  }
  for (const auto& patch : k["patches"]) {
    if (patch.size() != 1 || !patch["path"])
      return absl::InvalidArgumentError(absl::StrCat(dir.string(), ": only patches with just a path are supported"));
    for (const auto& d : YAML::LoadAllFromFile((dir / patch["path"].as<std::string>()).string())) {
      bool applied = false;
      for (auto& o : objs)
        if (KeyOf(o) == KeyOf(d) && o["apiVersion"].as<std::string>() == d["apiVersion"].as<std::string>()) {
          o = Merge(o, d), applied = true;
        }
      if (!applied) return absl::NotFoundError(absl::StrCat(dir.string(), ": the patch for ", KeyOf(d), " matches nothing"));
    }
  }
  for (const auto& l : k["labels"]) {
    if (l["includeSelectors"].as<bool>(false) || l["includeTemplates"].as<bool>(false))
      return absl::InvalidArgumentError("labels: includeSelectors/includeTemplates are not supported");
    for (auto& o : objs)
      for (const auto& kv : l["pairs"]) o["metadata"]["labels"][kv.first.as<std::string>()] = kv.second.as<std::string>();
  }
  for (const auto& img : k["images"])
    for (auto& o : objs)
      for (auto spec : PodSpecs(o))
        for (const char* list : {"containers", "initContainers"})
          for (auto c : spec[list]) {
            std::string image = c["image"].as<std::string>(""), name = image.substr(0, image.find(':'));
            if (name != img["name"].as<std::string>()) continue;
            std::string tag = image.find(':') == std::string::npos ? "" : image.substr(image.find(':') + 1);
            if (img["newName"]) name = img["newName"].as<std::string>();
            if (img["newTag"]) tag = img["newTag"].as<std::string>();
            c["image"] = tag.empty() ? name : name + ":" + tag;
          }
  if (k["namespace"])
    for (auto& o : objs)
      if (o["kind"].as<std::string>("") != "Namespace") o["metadata"]["namespace"] = k["namespace"].as<std::string>();
  return objs;
}

// A canonical text of a node: map keys sorted, named lists sorted by name, scalars as
// text with YAML 1.1 octal (0400) as decimal, as kubectl prints it.
std::string Canon(const YAML::Node& n) {
  if (n.IsMap()) {
    std::map<std::string, std::string> m;
    for (const auto& kv : n) m[kv.first.as<std::string>()] = Canon(kv.second);
    std::string s = "{";
    for (const auto& [k, v] : m) absl::StrAppend(&s, k, ":", v, ",");
    return s + "}";
  }
  if (n.IsSequence()) {
    std::vector<std::string> items;
    for (const auto& e : n) items.push_back(Canon(e));
    if (NamedList(n)) std::sort(items.begin(), items.end());
    return "[" + absl::StrJoin(items, ",") + "]";
  }
  if (n.IsNull()) return "null";
  std::string s = n.as<std::string>();
  if (s.size() > 1 && s[0] == '0' && s.find_first_not_of("01234567") == std::string::npos) s = std::to_string(std::stol(s, nullptr, 8));
  return s;
}

// ---- lint ----

struct Lint {
  YAML::Node schema = YAML::LoadFile(std::string(TESSERA_SOURCE_DIR) + "/tests/deploy/k8s_schema.yaml");
  std::vector<std::string> errors;

  void Error(const std::string& where, const std::string& what) { errors.push_back(where + ": " + what); }

  static bool IsInt(const YAML::Node& n) {
    if (!n.IsScalar() || n.Tag() == "!") return false;  // a quoted "1" is a string
    const std::string s = n.as<std::string>();
    return !s.empty() && s.find_first_not_of("-0123456789") == std::string::npos;
  }
  static bool IsBool(const YAML::Node& n) {
    if (!n.IsScalar() || n.Tag() == "!") return false;
    const std::string s = n.as<std::string>();
    return s == "true" || s == "false";
  }
  static bool PlainNonString(const YAML::Node& n) {  // what YAML reads as a bool, number or null
    return n.IsScalar() && n.Tag() != "!" && (IsBool(n) || IsInt(n) || n.as<std::string>() == "null");
  }

  void Check(const YAML::Node& n, const std::string& type, const std::string& where) {
    if (type.size() > 2 && type.front() == '[') {
      if (!n.IsSequence()) return Error(where, "expected a list");
      for (size_t i = 0; i < n.size(); ++i) Check(n[i], type.substr(1, type.size() - 2), absl::StrCat(where, "[", i, "]"));
      return;
    }
    if (type == "string") {
      if (!n.IsScalar() || PlainNonString(n)) Error(where, "expected a string (quote it)");
    } else if (type == "int") {
      if (!IsInt(n)) Error(where, "expected an integer");
    } else if (type == "bool") {
      if (!IsBool(n)) Error(where, "expected true or false");
    } else if (type == "intstr" || type == "quantity") {
      if (!n.IsScalar()) Error(where, "expected a number or a string");
    } else if (type == "quantities") {
      if (!n.IsMap()) return Error(where, "expected a map");
      for (const auto& kv : n)
        if (!kv.second.IsScalar() || IsBool(kv.second))
          Error(where + "." + kv.first.as<std::string>(), "expected a quantity (a number or a string such as 8Gi)");
    } else if (type == "map") {
      if (!n.IsMap()) return Error(where, "expected a map");
      for (const auto& kv : n)
        if (!kv.second.IsScalar() || PlainNonString(kv.second))
          Error(where + "." + kv.first.as<std::string>(), "values here are strings: quote it");
    } else {
      const YAML::Node t = schema["types"][type];
      if (!t) return Error(where, "schema has no type " + type);
      CheckFields(n, t, where);
    }
  }
  void CheckFields(const YAML::Node& n, const YAML::Node& fields, const std::string& where) {
    if (!n.IsMap()) return Error(where, "expected an object");
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      if (!fields[k]) Error(where + "." + k, "unknown field");
      else Check(kv.second, fields[k].as<std::string>(), where + "." + k);
    }
  }
  void Schema(const YAML::Node& o) {
    const std::string api = o["apiVersion"].as<std::string>(""), kind = o["kind"].as<std::string>("");
    const YAML::Node k = schema["kinds"][api + "/" + kind];
    if (!k) return Error(KeyOf(o), "apiVersion " + api + " kind " + kind + " is not one the schema knows");
    CheckFields(o, k, KeyOf(o));
  }
};

bool Selects(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector.IsMap() || selector.size() == 0) return false;
  for (const auto& kv : selector)
    if (!labels[kv.first.as<std::string>()] || labels[kv.first.as<std::string>()].as<std::string>() != kv.second.as<std::string>())
      return false;
  return true;
}

std::vector<std::string> LintAll(const std::vector<YAML::Node>& objs) {
  Lint lint;
  std::set<std::string> present;
  for (const auto& o : objs) present.insert(KeyOf(o));
  std::vector<const YAML::Node*> workloads;
  for (const auto& o : objs) {
    lint.Schema(o);
    const std::string where = KeyOf(o), kind = o["kind"].as<std::string>("");
    if (kind != "Namespace" && o["metadata"]["namespace"].as<std::string>("") != "tessera")
      lint.Error(where, "not in the tessera namespace");
    if (!PodSpecs(o).empty()) {
      workloads.push_back(&o);
      if (!Selects(o["spec"]["selector"]["matchLabels"], o["spec"]["template"]["metadata"]["labels"]))
        lint.Error(where, "spec.selector.matchLabels does not match the pod template's labels");
    }
    // A pod that asks Prometheus to scrape it (deploy/prometheus/kubernetes.yml) names a
    // port its containers declare and an absolute path.
    if (const YAML::Node ann = PodSpecs(o).empty() ? YAML::Node() : o["spec"]["template"]["metadata"]["annotations"];
        ann && ann["prometheus.io/scrape"].as<std::string>("") == "true") {
      const std::string port = ann["prometheus.io/port"].as<std::string>("");
      bool declared = false;
      for (const auto& spec : PodSpecs(o))
        for (const auto& c : spec["containers"])
          for (const auto& p : c["ports"]) declared |= p["containerPort"].as<std::string>("") == port;
      if (!declared) lint.Error(where, "prometheus.io/port " + port + " is not a declared container port");
      if (!absl::StartsWith(ann["prometheus.io/path"].as<std::string>("/metrics"), "/"))
        lint.Error(where, "prometheus.io/path must be an absolute path");
    }
    for (const auto& spec : PodSpecs(o)) {
      std::set<std::string> volumes;
      for (const auto& v : spec["volumes"]) {
        volumes.insert(v["name"].as<std::string>(""));
        if (v["persistentVolumeClaim"] && !present.count("PersistentVolumeClaim/" + v["persistentVolumeClaim"]["claimName"].as<std::string>("")))
          lint.Error(where, "volume " + v["name"].as<std::string>("") + ": no such PersistentVolumeClaim");
        if (v["secret"]) {
          const std::string s = v["secret"]["secretName"].as<std::string>("");
          if (s != "tessera-controller" && s != "tessera-join" && !present.count("Secret/" + s))
            lint.Error(where, "Secret " + s + " is neither rendered nor one the operator makes");
        }
      }
      int sources = 0;
      for (const auto& v : spec["volumes"]) {
        sources = 0;
        for (const char* src : {"emptyDir", "secret", "configMap", "persistentVolumeClaim", "hostPath"}) sources += v[src] ? 1 : 0;
        if (sources != 1) lint.Error(where, "volume " + v["name"].as<std::string>("") + " has " + std::to_string(sources) + " sources");
      }
      for (const auto& c : spec["containers"]) {
        const std::string cw = where + " container " + c["name"].as<std::string>("");
        const std::string image = c["image"].as<std::string>("");
        if (image.find(':') == std::string::npos || absl::EndsWith(image, ":latest")) lint.Error(cw, "image " + image + " has no pinned tag");
        std::set<std::string> ports;
        for (const auto& p : c["ports"]) ports.insert(p["name"].as<std::string>("")), ports.insert(p["containerPort"].as<std::string>(""));
        for (const char* probe : {"readinessProbe", "livenessProbe", "startupProbe"}) {
          const YAML::Node pr = c[probe];
          if (!pr) continue;
          for (const char* how : {"grpc", "httpGet", "tcpSocket"})
            if (pr[how] && !ports.count(pr[how]["port"].as<std::string>("")))
              lint.Error(cw, std::string(probe) + " port " + pr[how]["port"].as<std::string>("") + " is not a declared container port");
        }
        if (c["resources"]["requests"]["nvidia.com/gpu"]) lint.Error(cw, "nvidia.com/gpu belongs in limits only");
        for (const auto& m : c["volumeMounts"])
          if (!volumes.count(m["name"].as<std::string>(""))) lint.Error(cw, "mounts volume " + m["name"].as<std::string>("") + " the pod lacks");
        for (const auto& e : c["envFrom"])
          if (e["configMapRef"] && !present.count("ConfigMap/" + e["configMapRef"]["name"].as<std::string>("")))
            lint.Error(cw, "envFrom: no ConfigMap " + e["configMapRef"]["name"].as<std::string>(""));
      }
    }
  }
  auto workload_for = [&](const YAML::Node& selector) -> const YAML::Node* {
    for (const auto* w : workloads)
      if (Selects(selector, (*w)["spec"]["template"]["metadata"]["labels"])) return w;
    return nullptr;
  };
  bool gpu_worker = false;
  for (const auto* w : workloads)
    for (const auto& c : (*w)["spec"]["template"]["spec"]["containers"])
      gpu_worker |= c["resources"]["limits"]["nvidia.com/gpu"].IsDefined();
  if (!gpu_worker) lint.Error("render", "no workload asks for nvidia.com/gpu in its limits");
  for (const auto& o : objs) {
    const std::string kind = o["kind"].as<std::string>(""), where = KeyOf(o);
    if (kind != "Service" && kind != "PodDisruptionBudget" && kind != "NetworkPolicy") continue;
    const YAML::Node selector = kind == "Service"               ? o["spec"]["selector"]
                                : kind == "PodDisruptionBudget" ? o["spec"]["selector"]["matchLabels"]
                                                                : o["spec"]["podSelector"]["matchLabels"];
    const YAML::Node* w = workload_for(selector);
    if (w == nullptr) {
      lint.Error(where, "its selector matches no workload's pods");
      continue;
    }
    if (kind == "Service")
      for (const auto& p : o["spec"]["ports"]) {
        std::set<std::string> ports;
        for (const auto& c : (*w)["spec"]["template"]["spec"]["containers"])
          for (const auto& cp : c["ports"]) ports.insert(cp["name"].as<std::string>("")), ports.insert(cp["containerPort"].as<std::string>(""));
        const std::string target = p["targetPort"] ? p["targetPort"].as<std::string>() : p["port"].as<std::string>("");
        if (!ports.count(target)) lint.Error(where, "targetPort " + target + " is not a port of " + KeyOf(*w) + "'s containers");
      }
  }
  return lint.errors;
}

const std::vector<std::string> kOverlays = {"single-node", "multi-node"};

TEST(Manifests, EveryOverlayRendersAndPassesTheLint) {
  for (const auto& overlay : kOverlays) {
    auto objs = Build(kK8s / "overlays" / overlay);
    ASSERT_TRUE(objs.ok()) << overlay << ": " << objs.status();
    std::set<std::string> kinds;
    for (const auto& o : *objs) kinds.insert(o["kind"].as<std::string>());
    EXPECT_EQ(kinds, (std::set<std::string>{"Namespace", "ConfigMap", "PersistentVolumeClaim", "Deployment", "Service",
                                            "DaemonSet", "PodDisruptionBudget", "NetworkPolicy"}))
        << overlay;
    const auto errors = LintAll(*objs);
    EXPECT_TRUE(errors.empty()) << overlay << ":\n  " << absl::StrJoin(errors, "\n  ");
    for (const auto& o : *objs) {
      if (KeyOf(o) == "Deployment/tessera-controller") {
        EXPECT_EQ(o["spec"]["replicas"].as<int>(), 1);
        EXPECT_EQ(o["spec"]["strategy"]["type"].as<std::string>(), "Recreate");
      }
      if (KeyOf(o) == "DaemonSet/tessera-worker") {
        const auto& spec = o["spec"]["template"]["spec"];
        EXPECT_GE(spec["terminationGracePeriodSeconds"].as<int>(), 60) << overlay;
        bool shm = false;
        for (const auto& v : spec["volumes"])
          shm |= v["name"].as<std::string>() == "dshm" && v["emptyDir"]["medium"].as<std::string>("") == "Memory";
        EXPECT_TRUE(shm) << overlay << ": /dev/shm is not a memory emptyDir";
      }
    }
  }
}

// The lint is not a rubber stamp: each kind of mistake it claims to catch is caught.
TEST(Manifests, TheLintCatchesEachMistake) {
  auto base = Build(kK8s / "overlays/single-node");
  ASSERT_TRUE(base.ok()) << base.status();
  auto with = [&](const std::string& key, auto edit) {
    std::vector<YAML::Node> objs;
    for (const auto& o : *base) objs.push_back(YAML::Clone(o));
    for (auto& o : objs)
      if (KeyOf(o) == key) edit(o);
    return absl::StrJoin(LintAll(objs), "\n");
  };
  EXPECT_THAT(with("Deployment/tessera-controller", [](YAML::Node o) { o["spec"]["replicas"] = YAML::Load("\"1\""); }), HasSubstr("spec.replicas: expected an integer"));
  EXPECT_THAT(with("Deployment/tessera-controller", [](YAML::Node o) { o["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"; }),
              HasSubstr("imagePullPolicyy: unknown field"));
  EXPECT_THAT(with("DaemonSet/tessera-worker", [](YAML::Node o) {
                o["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = 1; }),
              HasSubstr("nvidia.com/gpu belongs in limits only"));
  EXPECT_THAT(with("DaemonSet/tessera-worker", [](YAML::Node o) {
                o["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].remove("nvidia.com/gpu"); }),
              HasSubstr("no workload asks for nvidia.com/gpu"));
  EXPECT_THAT(with("DaemonSet/tessera-worker", [](YAML::Node o) { o["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "worker"; }),
              HasSubstr("does not match the pod template's labels"));
  EXPECT_THAT(with("Service/tessera-controller", [](YAML::Node o) { o["spec"]["selector"]["app.kubernetes.io/name"] = "controller"; }),
              HasSubstr("Service/tessera-controller: its selector matches no workload's pods"));
  EXPECT_THAT(with("Service/tessera-controller", [](YAML::Node o) { o["spec"]["ports"][0]["targetPort"] = "rpc"; }),
              HasSubstr("targetPort rpc is not a port"));
  EXPECT_THAT(with("Deployment/tessera-controller", [](YAML::Node o) {
                o["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = 7072; }),
              HasSubstr("readinessProbe port 7072 is not a declared container port"));
  EXPECT_THAT(with("DaemonSet/tessera-worker", [](YAML::Node o) { o["spec"]["template"]["spec"]["nodeSelector"]["gpu"] = YAML::Load("true"); }),
              HasSubstr("nodeSelector.gpu: values here are strings"));
  EXPECT_THAT(with("DaemonSet/tessera-worker", [](YAML::Node o) {
                o["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["name"] = "scratch"; }),
              HasSubstr("mounts volume scratch the pod lacks"));
  EXPECT_THAT(with("Deployment/tessera-controller", [](YAML::Node o) {
                o["spec"]["template"]["spec"]["containers"][0]["image"] = "tessera-controller:latest"; }),
              HasSubstr("has no pinned tag"));
  EXPECT_THAT(with("ConfigMap/tessera-config", [](YAML::Node o) { o["metadata"]["namespace"] = "default"; }),
              HasSubstr("not in the tessera namespace"));
  EXPECT_THAT(with("DaemonSet/tessera-worker", [](YAML::Node o) {
                o["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] = "9999"; }),
              HasSubstr("prometheus.io/port 9999 is not a declared container port"));
}

// The controller and the workers ask to be scraped, and the shipped Kubernetes scrape
// configuration keeps exactly the pods that ask, by the annotations the manifests use,
// naming the jobs by component.
TEST(Manifests, PodsAskToBeScrapedAsTheShippedScrapeConfigReadsThem) {
  auto objs = Build(kK8s / "overlays/single-node");
  ASSERT_TRUE(objs.ok()) << objs.status();
  std::set<std::string> scraped;
  for (const auto& o : *objs)
    if (!PodSpecs(o).empty() &&
        o["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"].as<std::string>("") == "true")
      scraped.insert(o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"].as<std::string>(""));
  EXPECT_EQ(scraped, (std::set<std::string>{"controller", "worker"}));
  const YAML::Node conf = YAML::LoadFile(std::string(TESSERA_SOURCE_DIR) + "/deploy/prometheus/kubernetes.yml");
  ASSERT_EQ(conf["scrape_configs"].size(), 1u);
  const YAML::Node job = conf["scrape_configs"][0];
  EXPECT_EQ(job["kubernetes_sd_configs"][0]["role"].as<std::string>(), "pod");
  EXPECT_EQ(job["kubernetes_sd_configs"][0]["namespaces"]["names"][0].as<std::string>(), "tessera");
  std::set<std::string> sources, jobs;
  bool keeps = false;
  for (const auto& r : job["relabel_configs"]) {
    for (const auto& l : r["source_labels"]) sources.insert(l.as<std::string>());
    if (r["action"].as<std::string>("") == "keep")
      keeps = r["source_labels"][0].as<std::string>() == "__meta_kubernetes_pod_annotation_prometheus_io_scrape" &&
              r["regex"].as<std::string>() == "true";
    if (r["target_label"].as<std::string>("") == "job") jobs.insert(r["replacement"].as<std::string>());
  }
  EXPECT_TRUE(keeps);
  for (const char* a : {"port", "path"}) EXPECT_TRUE(sources.count(std::string("__meta_kubernetes_pod_annotation_prometheus_io_") + a)) << a;
  EXPECT_EQ(jobs, (std::set<std::string>{"tessera-controller", "tessera-agent"}));
}

// What keeps a pod from the "restricted" Pod Security Standard (v1.30's checks of the
// fields these manifests use): host namespaces, privileged containers, capabilities
// beyond NET_BIND_SERVICE or not dropping ALL, host paths, host ports, privilege
// escalation, running as root, and no RuntimeDefault/Localhost seccomp profile.
std::string SeccompType(const YAML::Node& security_context, const std::string& otherwise) {
  if (!security_context || !security_context["seccompProfile"] || !security_context["seccompProfile"]["type"]) return otherwise;
  return security_context["seccompProfile"]["type"].as<std::string>();
}
std::vector<std::string> RestrictedViolations(const YAML::Node& o) {
  std::vector<std::string> out;
  for (const auto& spec : PodSpecs(o)) {
    const auto& psc = spec["securityContext"];
    for (const char* host : {"hostNetwork", "hostPID", "hostIPC"})
      if (spec[host].as<bool>(false)) out.push_back(host);
    if (spec["volumes"])
      for (const auto& v : spec["volumes"])
        for (const auto& kv : v)
        if (const std::string type = kv.first.as<std::string>();
            type != "name" && !std::set<std::string>{"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                                     "persistentVolumeClaim", "projected", "secret"}.count(type) &&
            !kv.second.IsNull())
          out.push_back(absl::StrCat("volume ", v["name"].as<std::string>(), ": ", type));
    const bool pod_nonroot = psc["runAsNonRoot"].as<bool>(false);
    const std::string pod_seccomp = SeccompType(psc, "");
    for (const char* key : {"containers", "initContainers"}) {
      if (!spec[key]) continue;
      for (const auto& c : spec[key]) {
        const std::string name = c["name"].as<std::string>();
        const auto& sc = c["securityContext"];
        if (sc["privileged"].as<bool>(false)) out.push_back(name + ": privileged");
        if (sc["allowPrivilegeEscalation"].as<bool>(true)) out.push_back(name + ": allowPrivilegeEscalation not false");
        if (!(sc["runAsNonRoot"].as<bool>(pod_nonroot))) out.push_back(name + ": may run as root");
        if (sc["runAsUser"].as<int>(psc["runAsUser"].as<int>(-1)) == 0) out.push_back(name + ": runAsUser 0");
        const std::string seccomp = SeccompType(sc, pod_seccomp);
        if (seccomp != "RuntimeDefault" && seccomp != "Localhost") out.push_back(name + ": no RuntimeDefault seccomp profile");
        bool drops_all = false;
        const YAML::Node caps = sc ? sc["capabilities"] : YAML::Node();
        if (caps && caps["drop"])
          for (const auto& d : caps["drop"]) drops_all |= d.as<std::string>() == "ALL";
        if (!drops_all) out.push_back(name + ": does not drop ALL capabilities");
        if (caps && caps["add"])
          for (const auto& a : caps["add"])
            if (a.as<std::string>() != "NET_BIND_SERVICE") out.push_back(name + ": adds " + a.as<std::string>());
        if (c["ports"])
          for (const auto& p : c["ports"])
            if (p["hostPort"]) out.push_back(name + ": hostPort");
      }
    }
  }
  return out;
}

// Every pod meets the restricted Pod Security level where its role allows, and the
// namespace enforces what the pods meet: all of them on one node; on several, all but the
// workers, which need the host network and IPC_LOCK (RDMA), and the namespace enforces
// "privileged" while it warns and audits against restricted.
TEST(Manifests, PodsMeetTheRestrictedPodSecurityLevelWhereTheRoleAllows) {
  for (const auto& overlay : kOverlays) {
    auto objs = Build(kK8s / "overlays" / overlay);
    ASSERT_TRUE(objs.ok()) << objs.status();
    std::map<std::string, std::string> ns_labels;
    for (const auto& o : *objs) {
      if (KeyOf(o) == "Namespace/tessera")
        for (const auto& kv : o["metadata"]["labels"]) ns_labels[kv.first.as<std::string>()] = kv.second.as<std::string>();
      if (PodSpecs(o).empty()) continue;
      const std::string v = absl::StrJoin(RestrictedViolations(o), "; ");
      if (overlay == "multi-node" && KeyOf(o) == "DaemonSet/tessera-worker")
        EXPECT_EQ(v, "hostNetwork; worker: adds IPC_LOCK") << overlay;
      else
        EXPECT_EQ(v, "") << overlay << " " << KeyOf(o);
    }
    EXPECT_EQ(ns_labels["pod-security.kubernetes.io/enforce"], overlay == "multi-node" ? "privileged" : "restricted") << overlay;
    EXPECT_EQ(ns_labels["pod-security.kubernetes.io/warn"], "restricted") << overlay;
    EXPECT_EQ(ns_labels["pod-security.kubernetes.io/audit"], "restricted") << overlay;
  }
  // The check is not a rubber stamp.
  auto objs = Build(kK8s / "overlays/single-node");
  ASSERT_TRUE(objs.ok());
  for (auto& o : *objs) {
    if (KeyOf(o) != "Deployment/tessera-controller") continue;
    YAML::Node bad = YAML::Clone(o);
    bad["spec"]["template"]["spec"]["securityContext"].remove("seccompProfile");
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"].push_back("SYS_ADMIN");
    YAML::Node host;
    host["name"] = "h";
    host["hostPath"]["path"] = "/srv";
    bad["spec"]["template"]["spec"]["volumes"].push_back(host);
    EXPECT_EQ(absl::StrJoin(RestrictedViolations(bad), "; "),
              "volume h: hostPath; controller: no RuntimeDefault seccomp profile; controller: adds SYS_ADMIN");
  }
}

// A worker's liveness is its agent's, not the controller's: the probe asks for the
// agent's "liveness" health service (SERVING while the agent runs), the readiness probe
// for the server as a whole (SERVING while registered with the controller).
TEST(Manifests, WorkerLivenessDoesNotDependOnTheController) {
  for (const auto& overlay : kOverlays) {
    auto objs = Build(kK8s / "overlays" / overlay);
    ASSERT_TRUE(objs.ok()) << objs.status();
    for (const auto& o : *objs) {
      if (KeyOf(o) != "DaemonSet/tessera-worker") continue;
      const auto& c = o["spec"]["template"]["spec"]["containers"][0];
      EXPECT_EQ(c["livenessProbe"]["grpc"]["service"].as<std::string>(""), "liveness") << overlay;
      EXPECT_EQ(c["readinessProbe"]["grpc"]["service"].as<std::string>(""), "") << overlay;
    }
  }
}

std::string Output(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

TEST(Manifests, RenderAsKubectlKustomizeDoes) {
  if (system("kubectl version --client > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "kubectl is not installed here; the render is checked against it where it is";
  for (const auto& overlay : kOverlays) {
    auto ours = Build(kK8s / "overlays" / overlay);
    ASSERT_TRUE(ours.ok()) << ours.status();
    const std::string text = Output("kubectl kustomize " + (kK8s / "overlays" / overlay).string() + " 2>&1");
    std::map<std::string, std::string> theirs, mine;
    for (const auto& d : YAML::LoadAll(text)) theirs[KeyOf(d)] = Canon(d);
    for (const auto& d : *ours) mine[KeyOf(d)] = Canon(d);
    ASSERT_EQ(theirs.size(), mine.size()) << overlay << ": kubectl rendered\n" << text;
    for (const auto& [k, v] : mine) EXPECT_EQ(theirs[k], v) << overlay << ": " << k;
  }
}

// deploy/docker/Dockerfile (no Docker engine runs here, so the images are not built in
// CI): the runtime stages install no compilers, build tools or -dev packages, run as the
// unprivileged uid 10001, and take their packages from scripts/runtime-packages.sh,
// which, run on this build's daemons, names the distribution's runtime libraries.
TEST(Manifests, ContainerImagesAreRuntimeOnlyAndUnprivileged) {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/deploy/docker/Dockerfile");
  std::map<std::string, std::string> stages;
  std::string line, stage, text;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "FROM ")) stage = line.substr(line.rfind(' ') + 1);
    if (!absl::StartsWith(line, "#")) stages[stage] += line + "\n";
  }
  ASSERT_TRUE(stages.count("build") && stages.count("controller") && stages.count("worker"));
  EXPECT_THAT(stages["build"], HasSubstr("scripts/setup.sh"));
  // The packages are installed in a layer of their own, before the sources come in (a
  // source change does not install them again).
  const std::string& b = stages["build"];
  ASSERT_NE(b.find("RUN bash scripts/setup.sh\n"), std::string::npos) << b;
  EXPECT_LT(b.find("COPY scripts/setup.sh"), b.find("RUN bash scripts/setup.sh\n"));
  EXPECT_LT(b.find("RUN bash scripts/setup.sh\n"), b.find("COPY . ."));
  for (const char* s : {"controller", "worker"}) {
    const std::string& t = stages[s];
    // Every image carries the CLI beside its daemon, and the runtime check runs it in each.
    EXPECT_THAT(t, ::testing::ContainsRegex("COPY --from=build /out/bin/tessera /out/bin/tessera-")) << s;
    for (const char* banned : {"setup.sh", "build-essential", "g++", "gcc", "clang", "cmake", "ninja", "-dev "})
      EXPECT_THAT(t, ::testing::Not(HasSubstr(banned))) << s;
    EXPECT_THAT(t, HasSubstr("USER 10001:10001")) << s;
    EXPECT_THAT(t, HasSubstr("$(cat /tmp/packages.txt)")) << s;
  }
  EXPECT_THAT(stages["worker"], HasSubstr("FROM nvidia/cuda:${CUDA_VERSION}-cudnn-runtime-"));
  EXPECT_THAT(stages["worker"], HasSubstr("NCCL_NVLS_ENABLE=0"));
  const std::string pkgs = Output(absl::StrCat("bash ", TESSERA_SOURCE_DIR, "/scripts/runtime-packages.sh ", TESSERA_BIN_DIR,
                                               "/tessera-controller ", TESSERA_BIN_DIR, "/tessera-worker 2>/dev/null"));
  EXPECT_THAT(pkgs, HasSubstr("libgrpc++1.51"));
  EXPECT_THAT(pkgs, HasSubstr("libopenblas0"));
  EXPECT_THAT(pkgs, ::testing::Not(HasSubstr("-dev")));
}

// The worker image's kernels serve more than one GPU generation: the build stage passes
// the Dockerfile's CUDA_ARCHITECTURES to CMake, and that list runs on Ampere (A100 8.0,
// A10 8.6), Ada (L40S 8.9) and Hopper (9.0, with Hopper's own kernels).
TEST(Manifests, TheWorkerImageCarriesKernelsForSeveralGpuGenerations) {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/deploy/docker/Dockerfile");
  std::string line, archs, text;
  while (std::getline(in, line)) {
    text += line + "\n";
    if (absl::StartsWith(line, "ARG CUDA_ARCHITECTURES=")) {
      archs = line.substr(line.find('=') + 1);
      archs.erase(std::remove(archs.begin(), archs.end(), '"'), archs.end());
    }
  }
  ASSERT_FALSE(archs.empty()) << "no ARG CUDA_ARCHITECTURES=... in the Dockerfile";
  EXPECT_THAT(text, HasSubstr("-DTESSERA_CUDA_ARCHITECTURES=\"${CUDA_ARCHITECTURES}\""));
  for (auto [major, minor] : {std::pair{8, 0}, {8, 6}, {8, 9}, {9, 0}})
    EXPECT_TRUE(kernels::CheckComputeCapability(archs, 0, "gpu", major, minor).ok()) << archs << " on " << major << "." << minor;
  EXPECT_TRUE(kernels::HopperKernels(archs, 9, 0)) << archs;
}

}  // namespace
}  // namespace tessera::testing
