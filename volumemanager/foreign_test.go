package volumemanager

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/nodevol/nodevol/csiplugin/csitest"
)

// foreignNS is the namespace of the foreign claims: those of other
// nodes' pods.
const foreignNS = "others"

// foreignClaims makes a fake clientset's API server hold n foreign claims
// (namespace foreignNS, claim-I) and their bound volumes (pv-claim-I)
// beside what its tracker holds. They are made when read, not stored:
// 100,000 of them cost the test nothing until something reads them, and
// served counts every one handed out, in a list or by a GET.
type foreignClaims struct {
	driver string
	count  int
	served atomic.Int64
}

// install puts the reactors in front of c's tracker; before any client
// use (the reactor chain is not safe to change while in use).
func (f *foreignClaims) install(c *fake.Clientset) {
	for _, res := range []string{"persistentvolumeclaims", "persistentvolumes"} {
		claims := res == "persistentvolumeclaims"
		c.PrependReactor("list", res, func(a clienttesting.Action) (bool, runtime.Object, error) {
			ns := a.GetNamespace()
			if claims && ns != "" && ns != foreignNS {
				return false, nil, nil
			}
			own, err := c.Tracker().List(a.GetResource(), v1.SchemeGroupVersion.WithKind(map[bool]string{true: "PersistentVolumeClaim", false: "PersistentVolume"}[claims]), ns)
			if err != nil {
				return true, nil, err
			}
			switch l := own.(type) {
			case *v1.PersistentVolumeClaimList:
				for i := range f.count {
					pvc, _ := f.pair(i)
					l.Items = append(l.Items, *pvc)
				}
			case *v1.PersistentVolumeList:
				for i := range f.count {
					_, pv := f.pair(i)
					l.Items = append(l.Items, *pv)
				}
			}
			f.served.Add(int64(f.count))
			return true, own, nil
		})
		c.PrependReactor("get", res, func(a clienttesting.Action) (bool, runtime.Object, error) {
			name := a.(clienttesting.GetAction).GetName()
			i, ok := f.index(name, claims)
			if !ok || claims && a.GetNamespace() != foreignNS {
				return false, nil, nil
			}
			f.served.Add(1)
			pvc, pv := f.pair(i)
			if claims {
				return true, pvc, nil
			}
			return true, pv, nil
		})
	}
}

// pair is foreign claim i and its volume.
func (f *foreignClaims) pair(i int) (*v1.PersistentVolumeClaim, *v1.PersistentVolume) {
	return csitest.BoundClaim(foreignNS, "claim-"+strconv.Itoa(i), csitest.PVSpec{Driver: f.driver, Handle: "foreign-handle-" + strconv.Itoa(i)})
}

// index is the number of foreign claim or volume name, if it is one.
func (f *foreignClaims) index(name string, claim bool) (int, bool) {
	prefix := "pv-claim-"
	if claim {
		prefix = "claim-"
	}
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0 && i < f.count
}

// TestForeignClaimsCostNothing: by default a node's memory does not grow
// with the claims and volumes of other nodes' pods. With 0, 10,000 and
// 100,000 foreign claims (each bound to a volume of its own) in the
// cluster, the manager mounts its one pod's claim, reads no foreign
// claim or volume (none is handed out: it holds none), and its live heap
// once mounted is the same within 1 MiB. The same run with
// Config.ClusterInformers and 10,000 foreign claims shows the measure's
// reach: every one is handed out and the heap grows by megabytes.
//
// The foreign claims are made when read (foreignClaims), so that the test
// costs no more with 100,000 of them than with none, as long as the
// manager reads none; it measures in a process of its own
// (measuringProcess).
func TestForeignClaimsCostNothing(t *testing.T) {
	if !measuringProcess(t) {
		return
	}
	const flat = 1 << 20
	mountBesideForeign(t, 0, false) // the first manager's one-time allocations (packages' state) are no foreign claim's
	var least, most int64 = 1 << 62, 0
	for _, n := range []int{0, 10000, 100000} {
		grown, served := mountBesideForeign(t, n, false)
		t.Logf("%d foreign claims: heap grew by %.2f MiB, %d foreign claims and volumes handed out", n, float64(grown)/(1<<20), served)
		if served != 0 {
			t.Errorf("%d foreign claims: %d foreign claims and volumes handed out to the manager, want none", n, served)
		}
		least, most = min(least, grown), max(most, grown)
	}
	if most-least > flat {
		t.Errorf("the heap once mounted varies by %.2f MiB with 0 to 100,000 foreign claims, want at most %.2f", float64(most-least)/(1<<20), float64(flat)/(1<<20))
	}

	const n = 10000
	grown, served := mountBesideForeign(t, n, true)
	t.Logf("Config.ClusterInformers, %d foreign claims: heap grew by %.2f MiB, %d foreign claims and volumes handed out", n, float64(grown)/(1<<20), served)
	if served < 2*n || grown-least < 8*flat {
		t.Errorf("Config.ClusterInformers with %d foreign claims: %d handed out, heap %.2f MiB above the default's; "+
			"want all of them and at least %d MiB: the measure does not see the informers", n, served, float64(grown-least)/(1<<20), 8*flat>>20)
	}
}

// mountBesideForeign runs a manager beside n foreign claims until its
// one pod's claim is mounted and returns how much the live heap grew from
// before New and how many foreign claims and volumes were handed out.
func mountBesideForeign(t *testing.T, n int, informers bool) (int64, int64) {
	t.Helper()
	client := fake.NewClientset()
	f := &foreignClaims{driver: csitest.DefaultDriverName, count: n}
	f.install(client)
	before := liveBytes()
	e := newEnv(t, envOptions{client: client, clusterInformers: informers})
	defer e.stop()
	e.claim("own")
	if err := e.mount(csitest.Pod("ns", "p", csitest.PodSpec{Volumes: []csitest.PodVolume{
		{Name: "data", Claim: "own"},
	}}), time.Minute); err != nil {
		t.Fatal(fmt.Errorf("%d foreign claims: %w", n, err))
	}
	client.ClearActions() // the fake's record of calls is not the manager's
	grown := int64(liveBytes()) - int64(before)
	return grown, f.served.Load()
}
