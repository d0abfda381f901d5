package reconciler

import (
	"testing"

	"github.com/nodevol/nodevol/internal/objectcache"
	"github.com/nodevol/nodevol/podvol"
)

// TestPluginOfChanged: a volume is retried when its plugin changes, also
// when that plugin is gone from the registry (a flexVolume driver removed).
func TestPluginOfChanged(t *testing.T) {
	changed := map[string]struct{}{"example.com/flex": {}}
	for _, tt := range []struct {
		name podvol.UniqueVolumeName
		want bool
	}{
		{"example.com/flex/uid-1-data", true},
		{"example.com/flexible/uid-1-data", false},
		{"kubernetes.io/csi/d^h", false},
	} {
		if got := pluginOf(tt.name, changed); got != tt.want {
			t.Errorf("pluginOf(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestObjectChangedRouting: a changed claim is posted as a claim, an
// attachment as an attachment (as their informers' events are); a volume
// and a configMap go to their holders.
func TestObjectChangedRouting(t *testing.T) {
	for _, tc := range []struct {
		ref  objectcache.Ref
		want func(b batch) bool
	}{
		{objectcache.Ref{Kind: objectcache.PersistentVolumeClaim, Namespace: "ns", Name: "c"}, func(b batch) bool { _, ok := b.claims["ns/c"]; return ok && len(b.objects) == 0 }},
		{objectcache.Ref{Kind: objectcache.VolumeAttachment, Name: "va"}, func(b batch) bool { _, ok := b.attachments["va"]; return ok && len(b.objects) == 0 }},
		{objectcache.Ref{Kind: objectcache.PersistentVolume, Name: "pv"}, func(b batch) bool { return len(b.objects) == 1 && len(b.claims) == 0 }},
		{objectcache.Ref{Kind: objectcache.ConfigMap, Namespace: "ns", Name: "cm"}, func(b batch) bool { return len(b.objects) == 1 && len(b.claims) == 0 }},
	} {
		in := NewInbox()
		in.ObjectChanged(tc.ref)
		if b := in.take(); !tc.want(b) {
			t.Errorf("%s: posted %+v", tc.ref, b.posted)
		}
	}
}
