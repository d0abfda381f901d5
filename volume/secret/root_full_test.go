package secret

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
	v1 "k8s.io/api/core/v1"
)

// TestRootSecretLargerThanTmpfs: a secret that does not fit the volume's
// tmpfs is an error naming the pod and the volume, the old files stay
// whole and visible, no part of the new version is visible, and a secret
// that fits again is written.
func TestRootSecretLargerThanTmpfs(t *testing.T) {
	e := rootEnv(t)
	ctx := context.Background()
	e.Objs.Put(objtest.Secret("s", map[string]string{"a": "v1", "b": "v1"}))
	spec := e.spec(t, "creds", v1.SecretVolumeSource{SecretName: "s", DefaultMode: ptr[int32](0o400)})
	spec.Attributes["sizeBytes"] = "1048576" // a 1 MiB tmpfs: the pod's memory limit, as it were
	req := objtest.Request(spec, "creds", nil)
	dir, err := e.SetUp(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "0400:-1:-1:v1", "b": "0400:-1:-1:v1"}
	if got := objtest.ReadVolume(t, dir, false); !maps.Equal(got, want) {
		t.Fatalf("files %v, want %v", got, want)
	}
	e.Objs.Put(objtest.Secret("s", map[string]string{"a": strings.Repeat("x", 2<<20), "b": "v2"}))
	_, err = e.SetUp(ctx, req)
	if err == nil || !strings.Contains(err.Error(), `secret volume "creds" of pod`) || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("SetUp of a secret larger than its tmpfs = %v, want an error naming the volume and the cause", err)
	}
	if got := objtest.ReadVolume(t, dir, false); !maps.Equal(got, want) {
		t.Fatalf("files after the failed update %v, want the old ones whole %v", got, want)
	}
	e.Objs.Put(objtest.Secret("s", map[string]string{"a": "v3", "b": "v3"}))
	if _, err := e.SetUp(ctx, req); err != nil {
		t.Fatalf("SetUp of a secret that fits again: %v", err)
	}
	if got, want := objtest.ReadVolume(t, dir, false), map[string]string{"a": "0400:-1:-1:v3", "b": "0400:-1:-1:v3"}; !maps.Equal(got, want) {
		t.Fatalf("files %v, want %v", got, want)
	}
}
