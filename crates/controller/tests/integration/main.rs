//! Integration tests of podctl-controller: one binary (one link step).
//!
//! - `chart`: the Helm chart (pinned helm) and the controller's manifests against the Kubernetes
//!   schemas (kubernetes-validate).
//! - `reconcile`: the loop against a Kubernetes API server on loopback (`kube-mock`): pods
//!   created, a deleted or evicted pod replaced and reported, a stopped job cleaned up, a second
//!   leader creating nothing twice.
//! - `remote`: finding a coordinator through a kubeconfig and port-forwarding to it.

// The workspace names this crate `controller` everywhere else; so do its tests.
extern crate podctl_controller as controller;

mod chart;
mod reconcile;
mod remote;
