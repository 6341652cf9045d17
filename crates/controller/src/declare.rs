//! Jobs declared as Kubernetes objects, for GitOps.
//!
//! `podctl launch --render` exports and uploads a job's bundle, then prints a ConfigMap that
//! holds the job: its spec and the bundle's URI and id. Applied to the namespace of an install
//! (by `kubectl apply`, Argo CD, Flux), the leading coordinator's controller submits it, once:
//! the job remembers the declaration it came from (`configmap/<name>/<uid>`) and the coordinator
//! refuses a second job from the same one, across leader changes. Deleting the declaration (a
//! GitOps prune) stops its job. Worker pods are never declared: they are the controller's, which
//! replaces them, and a GitOps tool that owned them would fight it.
//!
//! [`decide_declarations`] is pure, like [`crate::decide`]: (declarations observed, jobs the
//! coordinator holds from declarations) to actions.

use crate::decide::Action;
use crate::slice::{COMPONENT_LABEL, INSTANCE_LABEL, NAME_LABEL};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet};

/// `app.kubernetes.io/component` of a declaration.
pub const COMPONENT: &str = "job";
/// The key of the job spec (YAML) in a declaration.
pub const SPEC_KEY: &str = "job.yaml";
/// The key of the bundle's URI (where workers fetch it).
pub const BUNDLE_URI_KEY: &str = "bundle-uri";
/// The key of the bundle's id (its content hash).
pub const BUNDLE_ID_KEY: &str = "bundle-id";

/// A job as declared: what a submission carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    /// The job spec, as `podctl launch` would submit it.
    pub spec_yaml: String,
    /// Where the workers fetch the bundle.
    pub bundle_uri: String,
    /// The bundle's id.
    pub bundle_id: String,
}

/// The labels that make a ConfigMap a declaration for the install `instance`.
fn labels(instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.into(), "podctl".into()),
        (COMPONENT_LABEL.into(), COMPONENT.into()),
        (INSTANCE_LABEL.into(), instance.into()),
    ])
}

/// The label selector of the declarations of the install `instance`.
pub fn selector(instance: &str) -> String {
    labels(instance).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl Declaration {
    /// The ConfigMap `name` that declares this job to the install (Helm release) `instance`;
    /// in `namespace` when given (GitOps tools usually set the namespace themselves).
    pub fn config_map(&self, name: &str, namespace: Option<&str>, instance: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: namespace.map(str::to_owned),
                labels: Some(labels(instance)),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (SPEC_KEY.into(), self.spec_yaml.clone()),
                (BUNDLE_URI_KEY.into(), self.bundle_uri.clone()),
                (BUNDLE_ID_KEY.into(), self.bundle_id.clone()),
            ])),
            ..Default::default()
        }
    }

    /// What a ConfigMap declares, or what is missing from it.
    pub fn from_config_map(config_map: &ConfigMap) -> Result<Self, String> {
        let data = config_map.data.clone().unwrap_or_default();
        let get = |key: &str| {
            data.get(key).filter(|v| !v.trim().is_empty()).cloned().ok_or_else(|| {
                format!("it has no `{key}`; render it again with `podctl launch JOB --render`")
            })
        };
        Ok(Self {
            spec_yaml: get(SPEC_KEY)?,
            bundle_uri: get(BUNDLE_URI_KEY)?,
            bundle_id: get(BUNDLE_ID_KEY)?,
        })
    }
}

/// A declaration as listed from the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedDeclaration {
    /// The ConfigMap's name.
    pub name: String,
    /// `configmap/<name>/<uid>`: a ConfigMap deleted and applied again is a new declaration.
    pub source: String,
    /// What it declares, or why it declares nothing.
    pub declaration: Result<Declaration, String>,
}

impl ObservedDeclaration {
    /// Reads a listed ConfigMap.
    pub fn from_config_map(config_map: &ConfigMap) -> Option<Self> {
        let name = config_map.metadata.name.clone()?;
        let uid = config_map.metadata.uid.clone()?;
        Some(Self {
            source: format!("configmap/{name}/{uid}"),
            declaration: Declaration::from_config_map(config_map),
            name,
        })
    }
}

/// A job the coordinator holds that a declaration submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredJob {
    /// The declaration's source (see [`ObservedDeclaration::source`]).
    pub source: String,
    /// The job.
    pub job_id: String,
    /// Not ended yet.
    pub running: bool,
}

/// Submissions for declarations no job came from yet, stops for running jobs whose declaration
/// is gone, and a refusal (for the log) for each declaration that declares nothing.
pub fn decide_declarations(observed: &[ObservedDeclaration], jobs: &[DeclaredJob]) -> Vec<Action> {
    let known: BTreeSet<&str> = jobs.iter().map(|j| j.source.as_str()).collect();
    let present: BTreeSet<&str> = observed.iter().map(|d| d.source.as_str()).collect();
    let mut actions = Vec::new();
    for declared in observed {
        match &declared.declaration {
            Ok(_) if known.contains(declared.source.as_str()) => {}
            Ok(declaration) => actions.push(Action::SubmitJob {
                source: declared.source.clone(),
                declaration: declaration.clone(),
            }),
            Err(reason) => actions.push(Action::RefuseDeclaration {
                source: declared.source.clone(),
                reason: format!("configmap {}: {reason}", declared.name),
            }),
        }
    }
    for job in jobs.iter().filter(|j| j.running && !present.contains(j.source.as_str())) {
        let name = job.source.split('/').nth(1).unwrap_or(&job.source);
        actions.push(Action::StopJob {
            job_id: job.job_id.clone(),
            reason: format!("its declaration, configmap {name}, was deleted"),
        });
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn declaration() -> Declaration {
        Declaration {
            spec_yaml: "name: llm\n".into(),
            bundle_uri: "gs://b/runs/bundles/ab12".into(),
            bundle_id: "ab12".into(),
        }
    }

    fn observed(name: &str, uid: &str) -> ObservedDeclaration {
        let mut map = declaration().config_map(name, Some("train"), "podctl");
        map.metadata.uid = Some(uid.into());
        ObservedDeclaration::from_config_map(&map).unwrap()
    }

    #[test]
    fn a_declaration_round_trips_through_its_config_map() {
        let map = declaration().config_map("podctl-job-llm", None, "podctl");
        assert_eq!(Declaration::from_config_map(&map).unwrap(), declaration());
        let labels = map.metadata.labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/component"], "job");
        assert_eq!(
            selector("podctl"),
            "app.kubernetes.io/component=job,app.kubernetes.io/instance=podctl,app.kubernetes.io/name=podctl"
        );
        let mut broken = declaration().config_map("x", None, "podctl");
        broken.data.as_mut().unwrap().remove(BUNDLE_URI_KEY);
        let e = Declaration::from_config_map(&broken).unwrap_err();
        assert!(e.contains("no `bundle-uri`") && e.contains("--render"), "{e}");
    }

    #[test]
    fn each_declaration_is_submitted_once_and_its_deletion_stops_the_job() {
        let a = observed("podctl-job-a", "u1");
        let b = observed("podctl-job-b", "u2");
        let actions = decide_declarations(&[a.clone(), b.clone()], &[]);
        assert_eq!(
            actions,
            [
                Action::SubmitJob { source: "configmap/podctl-job-a/u1".into(), declaration: declaration() },
                Action::SubmitJob { source: "configmap/podctl-job-b/u2".into(), declaration: declaration() },
            ]
        );
        // Submitted: nothing more, even once the job ended (it is not run again).
        let jobs = [
            DeclaredJob { source: a.source.clone(), job_id: "a-1".into(), running: true },
            DeclaredJob { source: b.source.clone(), job_id: "b-2".into(), running: false },
        ];
        assert_eq!(decide_declarations(&[a.clone(), b.clone()], &jobs), []);
        // Deleted: the running job stops, the ended one is left alone.
        assert_eq!(
            decide_declarations(&[], &jobs),
            [Action::StopJob {
                job_id: "a-1".into(),
                reason: "its declaration, configmap podctl-job-a, was deleted".into()
            }]
        );
        // Applied again after a deletion: a new uid, a new job.
        let again = observed("podctl-job-a", "u3");
        assert!(matches!(
            &decide_declarations(&[again], &jobs)[..],
            [Action::SubmitJob { source, .. }, Action::StopJob { job_id, .. }]
                if source == "configmap/podctl-job-a/u3" && job_id == "a-1"
        ));
    }

    #[test]
    fn a_declaration_that_declares_nothing_is_refused_with_the_fix() {
        let mut map = declaration().config_map("podctl-job-x", None, "podctl");
        map.metadata.uid = Some("u9".into());
        map.data.as_mut().unwrap().remove(SPEC_KEY);
        let observed = ObservedDeclaration::from_config_map(&map).unwrap();
        match &decide_declarations(&[observed], &[])[..] {
            [Action::RefuseDeclaration { source, reason }] => {
                assert_eq!(source, "configmap/podctl-job-x/u9");
                assert!(reason.contains("configmap podctl-job-x: it has no `job.yaml`"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
