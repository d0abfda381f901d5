package emptydir

import (
	"testing"

	"k8s.io/mount-utils"
)

// TestNew: the public Config reaches the implementation whole: a missing
// field is refused, and a complete one makes the plugin of PluginName.
func TestNew(t *testing.T) {
	if _, err := New(Config{Mounter: mount.NewFakeMounter(nil)}); err == nil {
		t.Error("New without RootDir: no error")
	}
	if _, err := New(Config{RootDir: t.TempDir()}); err == nil {
		t.Error("New without Mounter: no error")
	}
	p, err := New(Config{RootDir: t.TempDir(), Mounter: mount.NewFakeMounter(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != PluginName || PluginName != "kubernetes.io/empty-dir" {
		t.Errorf("Name = %q, PluginName = %q", p.Name(), PluginName)
	}
}
