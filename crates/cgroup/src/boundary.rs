//! Where a process must not be moved out of its cgroup: under a limit that binds the
//! whole cgroup (a copy on a new group would double it, and no copy at all would lift
//! it), or inside a container or pod (moving it out takes it out of the container).

use std::fs;

use serde::Serialize;

use crate::{Cgroups, Version};

/// A container's cgroup, recognised by the names runtimes give them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Container {
    /// `docker`, `podman`, `containerd`, `cri-o`, `kubernetes`, `lxc`, `machine`.
    pub runtime: &'static str,
    /// The container's (or pod's) own cgroup: the path up to the matching component.
    pub group: String,
}

/// Why a process stays in its cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Boundary {
    /// `file` in `group` holds `value` (a CPU quota, pids.max, memory.max, io.max).
    Limit {
        group: String,
        file: &'static str,
        value: String,
    },
    Container(Container),
}

impl std::fmt::Display for Boundary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Boundary::Limit { group, file, value } => {
                write!(f, "{file} = {value:?} in {group} binds the whole group")
            }
            Boundary::Container(c) => write!(f, "inside {} container {}", c.runtime, c.group),
        }
    }
}

fn is_hex_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The container a cgroup path lies in, if its names say so. Covers Docker (cgroupfs
/// `/docker/ID` and systemd `docker-ID.scope`), Podman (`libpod-ID.scope`,
/// `/libpod_parent/libpod-ID`), containerd (`cri-containerd-ID.scope`, `/containerd/…`),
/// CRI-O (`crio-ID.scope`), the kubelet's pods (`kubepods…`, both drivers; the pod is the
/// unit), LXC (`lxc.payload.NAME`, `/lxc/NAME`) and systemd-machined's `machine.slice`.
pub fn container_of(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let upto = |i: usize| format!("/{}", parts[..=i].join("/"));
    for (i, &p) in parts.iter().enumerate() {
        let next = parts.get(i + 1).copied().unwrap_or("");
        // Kubernetes first: a pod holds containerd/docker/crio scopes.
        // `kubepods…`, or under a kubelet `--cgroup-root` (kind: `kubelet-kubepods.slice`).
        if p.starts_with("kubepods") || p.contains("-kubepods") {
            // The pod: `kubepods-…-podUID.slice` (systemd) or `podUID` (cgroupfs).
            let pod = parts[i..]
                .iter()
                .position(|q| q.starts_with("pod") || q.contains("-pod"))
                .map_or(i, |k| i + k);
            return Some(Container {
                runtime: "kubernetes",
                group: upto(pod),
            });
        }
        // The container's cgroup: this one, or the one below it.
        let found = if let Some(id) = p
            .strip_prefix("docker-")
            .and_then(|s| s.strip_suffix(".scope"))
        {
            is_hex_id(id).then_some(("docker", i))
        } else if p == "docker" {
            is_hex_id(next).then_some(("docker", i + 1))
        } else if p.starts_with("libpod-") {
            Some(("podman", i))
        } else if p.starts_with("cri-containerd-") {
            Some(("containerd", i))
        } else if let Some(&engine) = ["containerd", "lxc"].iter().find(|&&e| e == p) {
            (!next.is_empty()).then_some((engine, i + 1))
        } else if p.starts_with("crio-") && p.ends_with(".scope") {
            Some(("cri-o", i))
        } else if p.starts_with("lxc.payload") {
            Some(("lxc", i))
        } else if p == "machine.slice" && !next.starts_with("libpod-") {
            (!next.is_empty()).then_some(("machine", i + 1))
        } else {
            None
        };
        if let Some((runtime, at)) = found {
            return Some(Container {
                runtime,
                group: upto(at),
            });
        }
    }
    None
}

/// The pod cgroup of a Kubernetes BestEffort pod that `path` lies in, with either of the
/// kubelet's cgroup drivers: `/kubepods/besteffort/podUID` (cgroupfs) or
/// `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podUID.slice` (systemd).
pub fn besteffort_pod_of(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    // The kubelet's root may sit under a `--cgroup-root` (`/kubelet/kubepods`, or with the
    // systemd driver `kubelet.slice/kubelet-kubepods.slice`, each name prefixed).
    let k = parts
        .iter()
        .position(|p| *p == "kubepods" || p.ends_with("kubepods.slice"))?;
    let upto = |i: usize| format!("/{}", parts[..=i].join("/"));
    let (tier, pod) = (*parts.get(k + 1)?, *parts.get(k + 2)?);
    let found = if parts[k] == "kubepods" {
        tier == "besteffort" && pod.starts_with("pod")
    } else {
        tier.ends_with("kubepods-besteffort.slice")
            && pod.contains("kubepods-besteffort-pod")
            && pod.ends_with(".slice")
    };
    found.then(|| upto(k + 2))
}

/// The v2 files that bind a whole cgroup, each with what it reads when it binds nothing.
/// A file whose controller is not enabled there is absent, and binds nothing either.
type Unlimited = fn(&str) -> bool;
const V2_LIMITS: &[(&str, Unlimited)] = &[
    ("cpu.max", |v| v.starts_with("max")),
    ("pids.max", |v| v == "max"),
    ("memory.max", |v| v == "max"),
    ("memory.high", |v| v == "max"),
    ("memory.swap.max", |v| v == "max"),
    ("io.max", str::is_empty),
    // Empty: the parent's CPUs; a list: a confinement a move would escape.
    ("cpuset.cpus", str::is_empty),
];

impl Cgroups {
    /// Every BestEffort pod's cgroup on this host (both kubelet drivers).
    pub fn besteffort_pods(&self) -> Vec<String> {
        let tiers = [
            "/kubepods/besteffort",
            "/kubepods.slice/kubepods-besteffort.slice",
            // kind and other `--cgroup-root=/kubelet` nodes.
            "/kubelet/kubepods/besteffort",
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice",
        ];
        tiers
            .iter()
            .flat_map(|tier| {
                fs::read_dir(self.dir(tier))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(move |e| {
                        besteffort_pod_of(&format!("{tier}/{}", e.file_name().to_string_lossy()))
                    })
            })
            .collect()
    }

    /// The first limit found on `group` or an ancestor (below the root, which holds
    /// none), nearest first. v1's `cpu` hierarchy holds only the CPU quota (its other
    /// controllers are hierarchies a move here does not touch); v2's groups hold every
    /// enabled controller's limit.
    pub fn limit_of(&self, group: &str) -> Option<Boundary> {
        let mut path = group.trim_end_matches('/').to_string();
        while !path.is_empty() && path != "/" {
            let dir = self.dir(&path);
            let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
            let found = match self.version() {
                Version::V1 => read("cpu.cfs_quota_us")
                    .filter(|v| v.trim() != "-1")
                    .map(|v| ("cpu.cfs_quota_us", v)),
                Version::V2 => V2_LIMITS.iter().find_map(|&(file, unlimited)| {
                    read(file)
                        .filter(|v| !unlimited(v.trim()))
                        .map(|v| (file, v))
                }),
            };
            if let Some((file, value)) = found {
                return Some(Boundary::Limit {
                    group: path,
                    file,
                    value: value.trim().to_string(),
                });
            }
            path = match path.rfind('/') {
                Some(0) | None => String::new(),
                Some(i) => path[..i].to_string(),
            };
        }
        None
    }

    /// Why a process in `group` must stay in it, if it must.
    pub fn boundary_of(&self, group: &str) -> Option<Boundary> {
        container_of(group)
            .map(Boundary::Container)
            .or_else(|| self.limit_of(group))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn container_cgroups_are_known_for_every_runtime_and_driver() {
        let id = "0123456789abcdef0123456789abcdef";
        let cases = [
            (format!("/docker/{id}"), "docker", format!("/docker/{id}")),
            (
                format!("/system.slice/docker-{id}.scope"),
                "docker",
                format!("/system.slice/docker-{id}.scope"),
            ),
            (
                format!("/machine.slice/libpod-{id}.scope/container"),
                "podman",
                format!("/machine.slice/libpod-{id}.scope"),
            ),
            (
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/cri-containerd-ab.scope"
                    .to_string(),
                "kubernetes",
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice"
                    .to_string(),
            ),
            (
                "/kubepods/besteffort/pod1234/abcd".to_string(),
                "kubernetes",
                "/kubepods/besteffort/pod1234".to_string(),
            ),
            (
                "/kubepods/pod1234/abcd".to_string(),
                "kubernetes",
                "/kubepods/pod1234".to_string(),
            ),
            (
                "/lxc.payload.web/init.scope".to_string(),
                "lxc",
                "/lxc.payload.web".to_string(),
            ),
            (
                "/machine.slice/systemd-nspawn@deb.service/payload".to_string(),
                "machine",
                "/machine.slice/systemd-nspawn@deb.service".to_string(),
            ),
        ];
        for (path, runtime, group) in cases {
            let c = container_of(&path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!((c.runtime, c.group.as_str()), (runtime, group.as_str()));
        }
        for plain in [
            "/",
            "/user.slice/user-1000.slice/session-2.scope",
            "/system.slice/nginx.service",
            "/docker",
            "/machine.slice",
            "/appease.batch",
        ] {
            assert_eq!(container_of(plain), None, "{plain}");
        }
    }

    #[test]
    fn besteffort_pods_are_found_under_either_kubelet_driver() {
        assert_eq!(
            besteffort_pod_of("/kubepods/besteffort/pod12-34/0123abcd").as_deref(),
            Some("/kubepods/besteffort/pod12-34")
        );
        assert_eq!(
            besteffort_pod_of(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/cri-containerd-ab.scope"
            )
            .as_deref(),
            Some("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice")
        );
        assert_eq!(
            besteffort_pod_of("/kubelet/kubepods/besteffort/pod9/ctr").as_deref(),
            Some("/kubelet/kubepods/besteffort/pod9")
        );
        let kind = "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod9.slice";
        assert_eq!(
            besteffort_pod_of(&format!("{kind}/cri-containerd-ab.scope")).as_deref(),
            Some(kind)
        );
        assert_eq!(
            container_of(&format!("{kind}/cri-containerd-ab.scope")).map(|c| c.group),
            Some(kind.to_string())
        );
        for other in [
            "/kubepods/burstable/pod12/ab",
            "/kubepods/pod12/ab",
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
            "/kubepods/besteffort",
            "/",
        ] {
            assert_eq!(besteffort_pod_of(other), None, "{other}");
        }
        let (cg, root) = fake(Version::V1, "pods");
        for d in [
            "kubepods/besteffort/podA/ctr",
            "kubepods/burstable/podB",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podC.slice",
        ] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        let mut pods = cg.besteffort_pods();
        pods.sort();
        assert_eq!(
            pods,
            vec![
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podC.slice",
                "/kubepods/besteffort/podA"
            ]
        );
        fs::remove_dir_all(root).unwrap();
    }

    fn fake(version: Version, name: &str) -> (Cgroups, std::path::PathBuf) {
        let root =
            std::env::temp_dir().join(format!("appease-limits-{name}-{}", std::process::id()));
        let _fresh = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        (
            Cgroups {
                version,
                root: root.clone(),
            },
            root,
        )
    }

    fn put(root: &Path, group: &str, file: &str, value: &str) {
        let dir = root.join(group.trim_start_matches('/'));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(file), value).unwrap();
    }

    #[test]
    fn a_cpu_quota_on_an_ancestor_binds_its_whole_subtree_on_v1() {
        let (cg, root) = fake(Version::V1, "v1");
        put(&root, "/", "cpu.cfs_quota_us", "-1\n");
        put(&root, "/box", "cpu.cfs_quota_us", "50000\n");
        put(&root, "/box/job", "cpu.cfs_quota_us", "-1\n");
        put(&root, "/free", "cpu.cfs_quota_us", "-1\n");
        let b = cg.limit_of("/box/job").unwrap();
        assert_eq!(
            b,
            Boundary::Limit {
                group: "/box".into(),
                file: "cpu.cfs_quota_us",
                value: "50000".into()
            }
        );
        assert!(b.to_string().contains("binds the whole group"));
        assert_eq!(cg.limit_of("/free"), None);
        assert_eq!(cg.limit_of("/"), None);
        fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn every_v2_limit_counts_and_max_means_none() {
        let (cg, root) = fake(Version::V2, "v2");
        put(&root, "/a", "cpu.max", "max 100000\n");
        put(&root, "/a", "pids.max", "max\n");
        put(&root, "/a", "memory.max", "max\n");
        put(&root, "/a", "io.max", "");
        put(&root, "/a", "memory.high", "max\n");
        put(&root, "/a", "memory.swap.max", "max\n");
        put(&root, "/a", "cpuset.cpus", "\n");
        assert_eq!(cg.limit_of("/a"), None);
        for (file, value) in [
            ("cpu.max", "50000 100000"),
            ("pids.max", "20"),
            ("memory.max", "104857600"),
            ("io.max", "8:0 rbps=1048576 wbps=max riops=max wiops=max"),
            ("memory.high", "52428800"),
            ("memory.swap.max", "0"),
            ("cpuset.cpus", "0"),
        ] {
            put(&root, "/b", file, value);
            let got = cg.limit_of("/b/c/d").unwrap();
            assert!(
                matches!(got, Boundary::Limit { file: f, .. } if f == file),
                "{file}"
            );
            fs::remove_dir_all(root.join("b")).unwrap();
        }
        put(
            &root,
            "/system.slice/docker-0123456789abcdef.scope",
            "cpu.max",
            "max 100000",
        );
        assert!(matches!(
            cg.boundary_of("/system.slice/docker-0123456789abcdef.scope"),
            Some(Boundary::Container(Container {
                runtime: "docker",
                ..
            }))
        ));
        fs::remove_dir_all(root).unwrap();
    }
}
