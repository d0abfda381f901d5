// Package testenv runs a real kube-apiserver backed by a real etcd on the
// loopback interface, for integration tests of nodevol and of the node agents
// built on it. Start (or StartT in a test) finds the two binaries, starts
// etcd and then kube-apiserver on free 127.0.0.1 ports with data in fresh
// temporary directories, waits until the apiserver's /readyz answers ok and
// returns an Env; Env.Config is an admin *rest.Config, Env.Stop kills both
// processes, waits for them and removes every temporary file.
//
// # Binaries
//
// The package does not build anything. kube-apiserver (v1.37.2)
// and etcd (v3.7.0) are built by the separate module testenv/build of
// the nodevol repository, which requires k8s.io/kubernetes so that nodevol
// itself never does:
//
//	make testenv-bins
//
// builds both into ($XDG_CACHE_HOME/nodevol-testenv/v1.37.2,
// or ~/.cache/... when XDG_CACHE_HOME is unset) only when they are missing.
// The paths can be set in Options or by the environment variables
// NODEVOL_TESTENV_APISERVER, NODEVOL_TESTENV_ETCD and NODEVOL_TESTENV_DIR
// (see Options). Any etcd from 3.4 on works, for example Debian's etcd-server
// package: NODEVOL_TESTENV_ETCD=/usr/bin/etcd.
//
// # Identity and authorization
//
// Clients authenticate with static bearer tokens (an admin in the group
// system:masters, plus Options.Users) or with client certificates that
// Env.CertConfig issues at any time from the environment's client CA (for
// example a node's identity, CN=system:node:NAME and O=system:nodes).
// Env.WriteKubeconfig writes any of these configs as a kubeconfig file, for
// a client run as a process (--kubeconfig). The authorization modes and the
// admission plugins are the test's choice (Options.AuthorizationModes,
// Options.EnableAdmissionPlugins); the default is RBAC.
//
// # A bare apiserver
//
// No controller-manager, scheduler or kubelet runs, so the apiserver behaves
// differently from a cluster in ways that tests must allow for:
//
//   - The ServiceAccount admission plugin is disabled by default
//     (Options.DisableAdmissionPlugins): enabled, it rejects every pod
//     whose namespace has no service account, because no controller creates
//     the default one; creating the account by hand instead makes it inject
//     a projected token volume into every pod.
//   - The PVC and PV protection finalizers (kubernetes.io/pvc-protection,
//     kubernetes.io/pv-protection) are added and never removed: a deleted
//     claim or volume stays, with a deletion timestamp, until a test removes
//     the finalizer.
//   - A pod bound to a node (spec.nodeName set) stays terminating after a
//     graceful delete, since no kubelet confirms it: delete it with
//     GracePeriodSeconds 0 to remove it at once.
//   - A deleted namespace stays terminating, since no controller empties it:
//     tests use a namespace of their own and leave it to Stop.
//   - Nothing schedules pods, binds claims or attaches volumes: tests set
//     spec.nodeName, spec.volumeName and VolumeAttachment status themselves.
//   - No signer issues PodCertificateRequests (or CertificateSigningRequests)
//     and nothing deletes old requests: a test plays the signer with the
//     admin's client, setting the status an issued request needs.
//   - The kubernetes Service in the default namespace has endpoints, but
//     they name the advertise address 192.0.2.1 (TEST-NET-1, never routed),
//     not 127.0.0.1, which the endpoint reconciler refuses: clients use
//     Env.Host.
//
// The apiserver can be stopped and started again alone (Env.StopAPIServer,
// Env.StartAPIServer, Env.RestartAPIServer) on the same address, with its
// data kept in etcd, to test how clients ride out an outage. Right after
// such a restart (/readyz already ok), RBAC may refuse a non-admin user's
// requests as forbidden for a moment, until the authorizer has read the
// roles and bindings a test created: clients retry, and tests that look for
// "forbidden" in a client's log allow for it.
package testenv
