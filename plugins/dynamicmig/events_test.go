package dynamicmig

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
)

// TestLeaseTimes: the per-node heartbeat expiries follow Lease adds, updates and deletes
// (tombstones included); other Leases of the namespace are no heartbeat.
func TestLeaseTimes(t *testing.T) {
	now := time.Now()
	lease := func(name string, holder *string, renewed time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: api.DefaultSystemNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: holder, LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: renewed}}}
	}
	lt := newLeaseTimes()
	lt.set(lease(api.HeartbeatLeaseName("n1"), ptr.To("n1"), now), now)
	lt.set(lease(api.HeartbeatLeaseName("n2"), ptr.To("n2"), now.Add(-time.Minute)), now)
	lt.set(lease("dynamig-scheduler", ptr.To("n3"), now), now)
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"n1 heartbeat fresh", lt.heartbeatFresh("n1", now), true},
		{"n2 heartbeat expired", lt.heartbeatFresh("n2", now), false},
		{"n3 no heartbeat", lt.heartbeatFresh("n3", now), false},
		{"n1 heartbeat expired later", lt.heartbeatFresh("n1", now.Add(time.Minute)), false},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	pl := &DynamicMIG{leaseTimes: lt}
	lt.set(lease(api.HeartbeatLeaseName("n3"), ptr.To("n3"), now), now)
	pl.onLeaseDelete(cache.DeletedFinalStateUnknown{Key: "x", Obj: lease(api.HeartbeatLeaseName("n3"), ptr.To("n3"), now)})
	pl.onLeaseDelete(lease(api.HeartbeatLeaseName("n1"), ptr.To("n1"), now))
	if lt.heartbeatFresh("n1", now) || lt.heartbeatFresh("n3", now) {
		t.Error("deleted Leases still count")
	}
}

// TestHeartbeatUnderClockSkew: a node whose clock is 30 s behind or ahead of the scheduler's
// renews every 10 s with a 40 s Lease. Its heartbeat stays fresh between renewals and expires
// 40 s after the last renewal the scheduler saw, on the scheduler's clock, whatever the node
// wrote; a Lease first seen (a restarted scheduler) is fresh no longer than its duration.
func TestHeartbeatUnderClockSkew(t *testing.T) {
	start := time.Now()
	for _, skew := range []time.Duration{-30 * time.Second, 0, 30 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			lt := newLeaseTimes()
			renew := func(at time.Time) {
				lt.set(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: api.HeartbeatLeaseName("n")},
					Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: at.Add(skew)}}}, at)
			}
			renew(start)
			if skew > 0 && lt.heartbeatFresh("n", start.Add(41*time.Second)) {
				t.Error("first sight of a Lease from a clock ahead: fresh past its duration")
			}
			var last time.Time
			for at := start; at.Before(start.Add(2 * time.Minute)); at = at.Add(10 * time.Second) {
				renew(at)
				last = at
				for _, probe := range []time.Duration{0, 5 * time.Second, 9 * time.Second} {
					if !lt.heartbeatFresh("n", at.Add(probe)) {
						t.Fatalf("renewed at +%v: expired %v later", at.Sub(start), probe)
					}
				}
			}
			if !lt.heartbeatFresh("n", last.Add(39*time.Second)) {
				t.Error("expired before its duration after the last renewal")
			}
			if lt.heartbeatFresh("n", last.Add(41*time.Second)) {
				t.Error("fresh past its duration after the last renewal")
			}
		})
	}
}
