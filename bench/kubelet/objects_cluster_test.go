package kubeletbench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nodevol/nodevol/bench/internal/apiaudit"
	"github.com/nodevol/nodevol/internal/realnode"
	"github.com/nodevol/nodevol/testenv"
)

// objCluster is one side's API server (testenv's kube-apiserver with the
// Node authorizer, NodeRestriction and an audit log), the objects its pods
// use, and a scratch directory for the node's process.
type objCluster struct {
	env      *testenv.Env
	admin    kubernetes.Interface
	auditLog string
	// scratch holds the node's root directory, its kubeconfig, logs and
	// its working directory; removed at the end once nothing is mounted.
	scratch    string
	kubeconfig string
	nodeCfg    *rest.Config
}

const (
	objNode    = "node-1"
	objUser    = "system:node:" + objNode
	objNS      = "apps"
	objSA      = "app"
	objCM      = "app-config"
	objSecret  = "app-secret"
	objAccess  = "kube-api-access-x7k2q"
	objCMKey   = "value"
	objSecKey  = "password"
	objCMValue = "v1"
)

// startObjCluster starts the API server and creates what the pods need
// that a cluster's controllers would have made: the namespace, its
// service account and kube-root-ca.crt (testenv runs no controller
// manager), a configMap and a secret.
func startObjCluster(b *testing.B) *objCluster {
	b.Helper()
	scratch, err := os.MkdirTemp("", "objbench-")
	if err != nil {
		b.Fatal(err)
	}
	c := &objCluster{scratch: scratch}
	b.Cleanup(c.cleanup(b))
	args, auditLog, err := apiaudit.Args(scratch)
	if err != nil {
		b.Fatal(err)
	}
	c.auditLog = auditLog
	c.env = testenv.StartT(b, testenv.Options{
		AuthorizationModes:     []string{"Node", "RBAC"},
		EnableAdmissionPlugins: []string{"NodeRestriction"},
		APIServerArgs:          args,
	})
	adminCfg := c.env.Config()
	adminCfg.QPS, adminCfg.Burst = 200, 400
	c.admin = kubernetes.NewForConfigOrDie(adminCfg)
	nodeCfg, err := c.env.NodeConfig(objNode)
	if err != nil {
		b.Fatal(err)
	}
	c.nodeCfg = nodeCfg
	c.kubeconfig = filepath.Join(scratch, "node.kubeconfig")
	if err := c.env.WriteKubeconfig(c.kubeconfig, nodeCfg); err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	create := []func() error{
		func() error {
			_, err := c.admin.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: objNS}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := c.admin.CoreV1().ServiceAccounts(objNS).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: objSA}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": string(nodeCfg.CAData)}}
			_, err := c.admin.CoreV1().ConfigMaps(objNS).Create(ctx, cm, metav1.CreateOptions{})
			return err
		},
		func() error {
			cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: objCM}, Data: map[string]string{objCMKey: objCMValue}}
			_, err := c.admin.CoreV1().ConfigMaps(objNS).Create(ctx, cm, metav1.CreateOptions{})
			return err
		},
		func() error {
			s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: objSecret}, StringData: map[string]string{objSecKey: "s3cret"}}
			_, err := c.admin.CoreV1().Secrets(objNS).Create(ctx, s, metav1.CreateOptions{})
			return err
		},
	}
	for _, f := range create {
		if err := f(); err != nil {
			b.Fatalf("creating the pods' objects: %v", err)
		}
	}
	return c
}

// objPod is a pod as the API server admits it: what the ServiceAccount
// admission plugin adds (testenv turns it off), the projected
// kube-api-access volume, and a configMap, a secret and an emptyDir
// volume. hostNetwork: the fake runtime gives pods no IP.
func objPod(i int) *v1.Pod {
	expiration := int64(3607)
	mode := int32(0o644)
	projected := &v1.ProjectedVolumeSource{DefaultMode: &mode, Sources: []v1.VolumeProjection{
		{ServiceAccountToken: &v1.ServiceAccountTokenProjection{ExpirationSeconds: &expiration, Path: "token"}},
		{ConfigMap: &v1.ConfigMapProjection{LocalObjectReference: v1.LocalObjectReference{Name: "kube-root-ca.crt"},
			Items: []v1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
		{DownwardAPI: &v1.DownwardAPIProjection{Items: []v1.DownwardAPIVolumeFile{{Path: "namespace",
			FieldRef: &v1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
	}}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: objNS, Name: fmt.Sprintf("pod-%04d", i)},
		Spec: v1.PodSpec{
			NodeName: objNode, HostNetwork: true, ServiceAccountName: objSA,
			Containers: []v1.Container{{Name: "c", Image: "busybox", ImagePullPolicy: v1.PullIfNotPresent, VolumeMounts: []v1.VolumeMount{
				{Name: objAccess, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
				{Name: "config", MountPath: "/etc/config"},
				{Name: "creds", MountPath: "/etc/creds"},
				{Name: "scratch", MountPath: "/scratch"},
			}}},
			Volumes: []v1.Volume{
				{Name: objAccess, VolumeSource: v1.VolumeSource{Projected: projected}},
				{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: objCM}}}},
				{Name: "creds", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: objSecret}}},
				{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			},
		},
	}
}

// podFiles are the files (and the emptyDir) that every pod's volumes hold
// once they are set up, relative to {root}/pods/{uid}/volumes; the first
// is the configMap's file that the update changes.
var podFiles = []string{
	filepath.Join("kubernetes.io~configmap", "config", objCMKey),
	filepath.Join("kubernetes.io~secret", "creds", objSecKey),
	filepath.Join("kubernetes.io~projected", objAccess, "token"),
	filepath.Join("kubernetes.io~projected", objAccess, "ca.crt"),
	filepath.Join("kubernetes.io~projected", objAccess, "namespace"),
	filepath.Join("kubernetes.io~empty-dir", "scratch"),
}

// createPods creates n pods bound to the node and returns their volume
// directories ({root}/pods/{uid}/volumes).
func (c *objCluster) createPods(ctx context.Context, root string, n int) ([]string, error) {
	dirs := make([]string, 0, n)
	for i := range n {
		pod, err := c.admin.CoreV1().Pods(objNS).Create(ctx, objPod(i), metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("creating pod %d: %w", i, err)
		}
		dirs = append(dirs, filepath.Join(root, "pods", string(pod.UID), "volumes"))
	}
	return dirs, nil
}

// waitPodFiles polls every 10 ms until every pod's files exist, or
// timeout; it returns the pods still missing a file.
func waitPodFiles(dirs []string, timeout time.Duration) []string {
	deadline := time.Now().Add(timeout)
	pending := dirs
	for len(pending) > 0 && time.Now().Before(deadline) {
		var still []string
		for _, dir := range pending {
			for _, f := range podFiles {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					still = append(still, dir)
					break
				}
			}
		}
		pending = still
		if len(pending) > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return pending
}

// cleanup unmounts whatever the node's process left mounted under the
// scratch directory (the kubelet bind-mounts its root onto itself; the
// secret and projected volumes are tmpfs) and removes it.
func (c *objCluster) cleanup(b *testing.B) func() {
	return func() {
		if err := realnode.Unmount(c.scratch); err != nil {
			b.Errorf("not removing %s: %v", c.scratch, err)
			return
		}
		if err := os.RemoveAll(c.scratch); err != nil {
			b.Error(err)
		}
	}
}
