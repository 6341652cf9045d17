//! gRPC services between podctl, the coordinator and the workers (package podctl.v1)
