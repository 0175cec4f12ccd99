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
	lt.set(lease(api.HeartbeatLeaseName("n1"), ptr.To("n1"), now))
	lt.set(lease(api.HeartbeatLeaseName("n2"), ptr.To("n2"), now.Add(-time.Minute)))
	lt.set(lease("dynamig-scheduler", ptr.To("n3"), now))
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
	lt.set(lease(api.HeartbeatLeaseName("n3"), ptr.To("n3"), now))
	pl.onLeaseDelete(cache.DeletedFinalStateUnknown{Key: "x", Obj: lease(api.HeartbeatLeaseName("n3"), ptr.To("n3"), now)})
	pl.onLeaseDelete(lease(api.HeartbeatLeaseName("n1"), ptr.To("n1"), now))
	if lt.heartbeatFresh("n1", now) || lt.heartbeatFresh("n3", now) {
		t.Error("deleted Leases still count")
	}
}
