package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func TestControllerModifyVolume(t *testing.T) {
	f := newFixture(t, options{})
	ctx := context.Background()
	vol := f.create(t, "v")
	tests := []struct {
		name   string
		id     string
		params map[string]string
		want   codes.Code
	}{
		{"set the description", vol, map[string]string{descriptionParameter: "gold"}, codes.OK},
		{"no volume ID", "", map[string]string{descriptionParameter: "x"}, codes.InvalidArgument},
		{"volume ID ../x", "../x", nil, codes.InvalidArgument},
		{"unknown volume", "loop-missing", nil, codes.NotFound},
		{"unknown parameter", vol, map[string]string{"XXX_FakeKey": "v"}, codes.InvalidArgument},
		{"description too long", vol, map[string]string{descriptionParameter: strings.Repeat("x", 257)}, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.ctrl.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: tt.id, MutableParameters: tt.params})
			wantCode(t, tt.name, err, tt.want)
		})
	}
	d, err := newServer(options{NodeID: "node-1", StateDir: f.dir + "/state", Loop: f.loop, Mounter: f.mounter})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.store.get(vol).MutableParameters[descriptionParameter]; got != "gold" {
		t.Errorf("description after a restart = %q, want gold", got)
	}
	_, err = f.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "bad", MutableParameters: map[string]string{"XXX": "v"},
		VolumeCapabilities: []*csi.VolumeCapability{blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}})
	wantCode(t, "CreateVolume with an unknown mutable parameter", err, codes.InvalidArgument)
}
