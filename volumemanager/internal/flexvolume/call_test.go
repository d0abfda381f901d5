package flexvolume

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func TestParseReply(t *testing.T) {
	tests := []struct {
		name     string
		out      string
		wantErr  string
		notSupp  bool
		wantCaps capabilities
		wantDev  string
	}{
		{name: "success with the default capabilities", out: `{"status":"Success"}`, wantCaps: defaultCapabilities()},
		{name: "capabilities partly given", out: `{"status":"Success","capabilities":{"attach":false,"supportsMetrics":true}}`,
			wantCaps: capabilities{Attach: false, SELinuxRelabel: true, SupportsMetrics: true, FSGroup: true, RequiresFSResize: true}},
		{name: "capabilities spelt as the kubelet's struct", out: `{"status":"Success","Capabilities":{"attach":false}}`,
			wantCaps: capabilities{SELinuxRelabel: true, FSGroup: true, RequiresFSResize: true}},
		{name: "device", out: `{"status":"Success","device":"/dev/sdz"}`, wantCaps: defaultCapabilities(), wantDev: "/dev/sdz"},
		{name: "failure", out: `{"status":"Failure","message":"no such share"}`, wantErr: "mount command failed, status: Failure, reason: no such share"},
		{name: "not supported", out: `{"status":"Not supported"}`, wantErr: "Not supported", notSupp: true},
		{name: "not JSON", out: `Segmentation fault`, wantErr: `reading the reply of command mount ("Segmentation fault")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseReply("mount", []byte(tt.out))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || errors.Is(err, errNotSupported) != tt.notSupp {
					t.Fatalf("parseReply = %v, want an error with %q (not supported %v)", err, tt.wantErr, tt.notSupp)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *r.Caps != tt.wantCaps || r.DevicePath != tt.wantDev {
				t.Errorf("parseReply = caps %+v device %q, want %+v %q", *r.Caps, r.DevicePath, tt.wantCaps, tt.wantDev)
			}
		})
	}
}

func TestNotSupportedIsRemembered(t *testing.T) {
	rec := &recorder{replies: map[string]string{cmdGetVolumeName: `{"status":"Not supported"}`}}
	d, _ := testDriver(t, "example.com/nfs", capabilities{}, rec, nil)
	for range 2 {
		if _, err := d.run(context.Background(), call{cmdGetVolumeName, []string{"{}"}}); !errors.Is(err, errNotSupported) {
			t.Fatalf("run = %v, want ErrNotSupported", err)
		}
	}
	if got := rec.commands(); len(got) != 1 {
		t.Errorf("driver called %v, want getvolumename once", got)
	}
}

func TestExecErrorWithSuccessReply(t *testing.T) {
	rec := &recorder{fail: map[string]error{cmdUnmount: errors.New("exit status 3")}}
	d, _ := testDriver(t, "example.com/nfs", capabilities{}, rec, nil)
	if _, err := d.run(context.Background(), call{cmdUnmount, []string{"/x"}}); err == nil || err.Error() != "exit status 3" {
		t.Errorf("run = %v, want the exec error", err)
	}
}

func TestCallTimesOut(t *testing.T) {
	rec := &recorder{fail: map[string]error{cmdMount: errors.New("signal: killed")}}
	d, _ := testDriver(t, "example.com/nfs", capabilities{}, rec, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := d.run(ctx, call{cmdMount, []string{"/x", "{}"}})
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "timeout") {
		t.Errorf("run = %v, want a timeout wrapping the context's error", err)
	}
}
