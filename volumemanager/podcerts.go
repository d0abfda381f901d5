package volumemanager

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/nodevol/nodevol/podvol"
	"github.com/nodevol/nodevol/volumemanager/internal/podcert"
)

// podCertificates is the pod certificate manager as the projected plugin
// asks it.
type podCertificates struct{ m *podcert.Manager }

func (p podCertificates) Credentials(ctx context.Context, pod podvol.PodRef, volume string, sourceIndex int, src *v1.PodCertificateProjection) (key, chain []byte, err error) {
	c, err := p.m.Credentials(ctx, podcert.Request{Pod: pod, Volume: volume, SourceIndex: sourceIndex, Source: src})
	return c.PrivateKey, c.CertificateChain, err
}
