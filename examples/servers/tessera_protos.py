"""Tessera's protos as Python modules, for servers written with Debian's python3-grpcio.

The contract is proto/tessera/v1/*.proto. Debian ships no grpc_tools, so the message
classes come from protoc (the build's protobuf-compiler): load() runs
`protoc --python_out` over the repository's proto files into a temporary directory and
imports the modules; services are served with gRPC's generic handlers (serve()).
"""
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROTO_DIR = os.path.join(ROOT, "proto")


def load(*names):
    """Imports tessera/v1/<name>_pb2 for each name (e.g. "reward_service") and returns them."""
    protoc = shutil.which("protoc")
    if protoc is None:
        sys.exit("protoc not found: scripts/setup.sh installs protobuf-compiler")
    out = tempfile.mkdtemp(prefix="tessera-protos-")
    files = [os.path.join("tessera", "v1", n + ".proto") for n in names]
    subprocess.run([protoc, "--proto_path", PROTO_DIR, "--python_out", out] + files, check=True)
    sys.path.insert(0, out)
    return [importlib.import_module("tessera.v1.%s_pb2" % n) for n in names]


def handler(service, methods):
    """A generic handler for `service` ("tessera.v1.RewardService") from
    {method: (function(request, context), RequestClass, ResponseClass)}."""
    import grpc
    return grpc.method_handlers_generic_handler(service, {
        name: grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString)
        for name, (fn, req, resp) in methods.items()})


def serve(handlers, listen, workers=8):
    """Serves the handlers on `listen` (host:port; port 0 picks one) until interrupted.
    Prints "listening on HOST:PORT" once bound, so that a script can wait for it."""
    from concurrent import futures
    import grpc
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    for h in handlers:
        server.add_generic_rpc_handlers((h,))
    host = listen.rsplit(":", 1)[0]
    port = server.add_insecure_port(listen)
    if port == 0:
        sys.exit("cannot listen on %s" % listen)
    server.start()
    print("listening on %s:%d" % (host, port), flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(0)
