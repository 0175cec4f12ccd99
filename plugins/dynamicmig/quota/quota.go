// Package quota reads namespaces' GPU quotas in HAMi's form, ResourceQuotas whose spec.hard
// sets limits.<memory resource> (MiB) or limits.<cores resource> (percent of a GPU), and what
// a pod is granted against them: a MIG device its profile's memory and SMs (8,000 MiB asked
// on an A100-40GB is a 2g.10gb, 9,856 MiB), a hami-core device its share. The API server's
// own quota does not track these names (an extended resource's API-server quota is
// requests.<name> only), so the scheduler enforces them; kubectl dynamig shows them. It does
// not link k8s.io/kubernetes.
package quota

import (
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// LimitPrefix is HAMi's prefix of a quota's GPU limits.
const LimitPrefix = "limits."

// Names are the quota keys of the GPU memory and cores resources.
type Names struct{ Memory, Cores v1.ResourceName }

// NamesOf are the keys of the resources named memory and cores (nvidia.com/gpumem,
// nvidia.com/gpucores).
func NamesOf(memory, cores string) Names {
	return Names{Memory: v1.ResourceName(LimitPrefix + memory), Cores: v1.ResourceName(LimitPrefix + cores)}
}

// Limits is one ResourceQuota's GPU limits; one it does not set is -1.
type Limits struct {
	Name             string
	MemoryMiB, Cores int64
}

// Of reads q's GPU limits; ok is false when it sets neither.
func (n Names) Of(q *v1.ResourceQuota) (l Limits, ok bool) {
	l = Limits{Name: q.Name, MemoryMiB: -1, Cores: -1}
	if v, ok := q.Spec.Hard[n.Memory]; ok {
		l.MemoryMiB = v.Value()
	}
	if v, ok := q.Spec.Hard[n.Cores]; ok {
		l.Cores = v.Value()
	}
	return l, l.MemoryMiB >= 0 || l.Cores >= 0
}

// Tighter is the smaller of two limits, -1 being none.
func Tighter(a, b int64) int64 {
	if a < 0 || b >= 0 && b < a {
		return b
	}
	return a
}

// Reason is a quota refusal's reason, the start of its message.
const Reason = "namespace GPU quota exceeded"

// Check is a namespace's GPU quotas and what its pods are granted.
type Check struct {
	Namespace string
	Limits    []Limits
	Used      placement.Grant
}

// Exceeded says which of the namespace's quotas grant would take past its limit, as the
// scheduler's refusal says it; "" if none.
func (c *Check) Exceeded(grant placement.Grant, names Names) string {
	for _, q := range c.Limits {
		if q.MemoryMiB >= 0 && c.Used.MemoryMiB+grant.MemoryMiB > q.MemoryMiB {
			return c.refusal(q.Name, names.Memory, c.Used.MemoryMiB, q.MemoryMiB, grant.MemoryMiB)
		}
		if q.Cores >= 0 && c.Used.Cores+grant.Cores > q.Cores {
			return c.refusal(q.Name, names.Cores, c.Used.Cores, q.Cores, grant.Cores)
		}
	}
	return ""
}

func (c *Check) refusal(quota string, resource v1.ResourceName, used, limit, grant int64) string {
	return fmt.Sprintf("%s: ResourceQuota %s/%s %s: %d used of %d, and the pod would be granted %d on this node",
		Reason, c.Namespace, quota, resource, used, limit, grant)
}
