package scale

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/bench/internal/apiaudit"
	"github.com/nodevol/nodevol/csiplugin/csitest"
	"github.com/nodevol/nodevol/internal/kubelettest"
	"github.com/nodevol/nodevol/testenv"
)

const (
	// appsNS holds the nodes' own pods, claims, configMap and secret;
	// othersNS the claims of the rest of the cluster.
	appsNS    = "apps"
	othersNS  = "others"
	cmName    = "app-config"
	cmKey     = "value"
	secName   = "app-secret"
	secKey    = "password"
	createErr = "creating %s: %w"
)

// cluster is one run's API server (testenv's, with the Node authorizer,
// NodeRestriction and an audit log of the nodes' requests only), its
// CSI driver, and a scratch directory for the agents' root directories,
// kubeconfigs and logs.
type cluster struct {
	env      *testenv.Env
	admin    kubernetes.Interface
	auditLog string
	scratch  string
	driver   *csitest.Server
}

// nodeUser is the user name of node's client certificate.
var nodeUser = kubelettest.NodeUser

// startCluster starts the API server, whose audit log has the requests of
// nodes, the CSI driver, and creates what every node's pods share: the
// namespaces, the CSIDriver (no attach), a configMap and a secret.
func startCluster(b *testing.B, nodes []string) *cluster {
	b.Helper()
	scratch, err := os.MkdirTemp("", "scalebench-")
	if err != nil {
		b.Fatal(err)
	}
	c := &cluster{scratch: scratch}
	b.Cleanup(c.cleanup(b))
	users := make([]string, len(nodes))
	for i, n := range nodes {
		users[i] = nodeUser(n)
	}
	args, auditLog, err := apiaudit.Args(scratch, users...)
	if err != nil {
		b.Fatal(err)
	}
	c.auditLog = auditLog
	c.env = testenv.StartT(b, testenv.Options{
		AuthorizationModes:     []string{"Node", "RBAC"},
		EnableAdmissionPlugins: []string{"NodeRestriction"},
		APIServerArgs:          args,
	})
	cfg := c.env.Config()
	cfg.QPS = -1 // no client-side limit: the creates of the other claims go as fast as the server takes them
	c.admin = kubernetes.NewForConfigOrDie(cfg)
	if c.driver, err = csitest.Start("", csitest.Options{CreateTargetDirs: true, NoRecord: true}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.driver.Stop)
	if err := c.createShared(b.Context()); err != nil {
		b.Fatal(err)
	}
	if *scaleInf {
		if err := c.grantInformers(b.Context(), users); err != nil {
			b.Fatal(err)
		}
	}
	return c
}

func (c *cluster) createShared(ctx context.Context) error {
	core := c.admin.CoreV1()
	for _, ns := range []string{appsNS, othersNS} {
		if _, err := core.Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf(createErr, "namespace "+ns, err)
		}
	}
	if _, err := c.admin.StorageV1().CSIDrivers().Create(ctx, csitest.CSIDriver(c.driver.DriverName(), csitest.CSIDriverSpec{}), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf(createErr, "CSIDriver "+c.driver.DriverName(), err)
	}
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cmName}, Data: map[string]string{cmKey: "v1"}}
	if _, err := core.ConfigMaps(appsNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf(createErr, "configMap "+cmName, err)
	}
	sec := csitest.Secret(appsNS, secName, map[string]string{secKey: "s3cret"})
	if _, err := core.Secrets(appsNS).Create(ctx, sec, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf(createErr, "secret "+secName, err)
	}
	return nil
}

// informerReader is the ClusterRole -scale.informers grants the nodes:
// what the volume manager's informers of claims, volumes and attachments
// list and watch, which the Node authorizer does not allow a node.
const informerReader = "nodevol-informer-reader"

// grantInformers lets users get, list and watch every claim, volume and
// attachment of the cluster (RBAC, after the Node authorizer).
func (c *cluster) grantInformers(ctx context.Context, users []string) error {
	read := []string{"get", "list", "watch"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: informerReader}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims", "persistentvolumes"}, Verbs: read},
		{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"volumeattachments"}, Verbs: read},
	}}
	if _, err := c.admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf(createErr, "ClusterRole "+informerReader, err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: informerReader},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: informerReader}}
	for _, u := range users {
		binding.Subjects = append(binding.Subjects, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: u})
	}
	if _, err := c.admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf(createErr, "ClusterRoleBinding "+informerReader, err)
	}
	return nil
}

// createClaim creates, as the PV controller would have bound them, claim
// name in ns (status Bound) and the CSI volume bound to it (claimRef with
// the claim's UID); three requests.
func (c *cluster) createClaim(ctx context.Context, ns, name string) error {
	pvc, pv := csitest.BoundClaim(ns, name, csitest.PVSpec{Driver: c.driver.DriverName(), Handle: "handle-" + ns + "-" + name})
	claims := c.admin.CoreV1().PersistentVolumeClaims(ns)
	created, err := claims.Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf(createErr, "claim "+ns+"/"+name, err)
	}
	created.Status = pvc.Status // the API server drops the status of a create
	if _, err := claims.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("binding claim %s/%s: %w", ns, name, err)
	}
	pv.Spec.ClaimRef.UID = created.UID
	if _, err := c.admin.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf(createErr, "volume of claim "+ns+"/"+name, err)
	}
	return nil
}

// createOthers creates n bound claims and their volumes in othersNS,
// with workers creates at once.
func (c *cluster) createOthers(ctx context.Context, n, workers int) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n) && ctx.Err() == nil; i = next.Add(1) - 1 {
				if err := c.createClaim(ctx, othersNS, fmt.Sprintf("claim-%06d", i)); err != nil {
					cancel(err)
				}
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	infos, err := mount.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	var out []string
	for _, mi := range infos {
		if mi.MountPoint == dir || strings.HasPrefix(mi.MountPoint, dir+"/") {
			out = append(out, mi.MountPoint)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// cleanup detaches whatever an agent left mounted under the scratch
// directory (a sample that failed before its pods were deleted) and
// removes it.
func (c *cluster) cleanup(b *testing.B) func() {
	return func() {
		mps, err := mountsUnder(c.scratch)
		if err != nil {
			b.Error(err)
			return
		}
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
				b.Errorf("unmounting %s: %v", mp, err)
			}
		}
		if err := os.RemoveAll(c.scratch); err != nil {
			b.Error(err)
		}
	}
}
