// gRPC handlers of the controller. They only authenticate, unpack, call the
// JobManager / Rendezvous, and pack (docs/design.md §11).
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "common/rpc/auth.h"
#include "common/rpc/tls.h"
#include "controller/job_manager.h"
#include "controller/log_store.h"
#include "controller/metrics.h"
#include "controller/rendezvous.h"
#include "tessera/v1/cluster_service.grpc.pb.h"
#include "tessera/v1/job_service.grpc.pb.h"
#include "tessera/v1/node_service.grpc.pb.h"
#include "tessera/v1/rendezvous_service.grpc.pb.h"

namespace tessera::controller {

struct ServiceDeps {
  JobManager* jobs = nullptr;
  Rendezvous* rdv = nullptr;
  LogStore* logs = nullptr;
  Metrics* metrics = nullptr;
  const TokenAuthority* tokens = nullptr;
  std::string join_token;
  KeyPair ca;  // to issue node certificates
  JobManagerConfig cfg;
  std::vector<std::string> path_roots;  // CheckJobPaths at submit
};

std::unique_ptr<v1::JobService::Service> MakeJobService(ServiceDeps d);
std::unique_ptr<v1::ClusterService::Service> MakeClusterService(ServiceDeps d);
std::unique_ptr<v1::NodeService::Service> MakeNodeService(ServiceDeps d);
std::unique_ptr<v1::RendezvousService::Service> MakeRendezvousService(ServiceDeps d);
// Times every RPC the server handles, from its start to the status it sends, into
// Metrics::ObserveRpc with the status's code (ServerBuilder::experimental()
// .SetInterceptorCreators).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptors(Metrics* m);

}  // namespace tessera::controller
