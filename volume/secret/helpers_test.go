package secret

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/mount-utils"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volume/internal/objvolume/objtest"
)

// env is the plugin on a temporary root, with the fake objects, recording
// its steps.
type env struct{ *objtest.Env }

func newEnv(t *testing.T, root string, m mount.Interface) env {
	return env{objtest.NewEnv(t, root, m, New)}
}

// spec is the spec the volume manager gives pod volume name, resolved.
func (e env) spec(t *testing.T, name string, src v1.SecretVolumeSource) *podvol.VolumeSpec {
	t.Helper()
	return e.Spec(t, name, v1.VolumeSource{Secret: &src})
}

func ptr[T any](v T) *T { return &v }
