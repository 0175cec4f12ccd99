package inspect

import (
	"cmp"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
)

// QuotaUse is a namespace's use of one GPU resource against one of its ResourceQuotas: what
// its bound pods that have not ended are granted (a MIG device its profile's memory and SMs,
// a hami-core device its share), as the scheduler counts it.
type QuotaUse struct {
	Namespace string `json:"namespace"`
	// Quota is the ResourceQuota's name; "" for a namespace granted GPU memory or cores
	// without a quota that limits it.
	Quota string `json:"quota,omitempty"`
	// Resource is the quota key, limits.nvidia.com/gpumem (MiB) or limits.nvidia.com/gpucores
	// (percent of a GPU).
	Resource string `json:"resource"`
	Used     int64  `json:"used"`
	// Limit is the quota's; absent without a quota.
	Limit *int64 `json:"limit,omitempty"`
}

// Quotas is every namespace's GPU quota use: a row per ResourceQuota and GPU resource it
// limits, and a row without a quota per resource a namespace without one is granted, in
// namespace, quota and resource order. Pods reserved and not bound yet are not counted (only
// the scheduler sees them).
func Quotas(nodes []v1.Node, pods []v1.Pod, quotas []v1.ResourceQuota, names quota.Names) []QuotaUse {
	used := namespaceGrants(newCandidates(nodes, pods, nil, time.Time{}, nil))
	of := func(ns string, r v1.ResourceName) int64 {
		g := used[ns]
		switch {
		case g == nil:
			return 0
		case r == names.Memory:
			return g.MemoryMiB
		default:
			return g.Cores
		}
	}
	var out []QuotaUse
	limited := map[string]bool{}
	for i := range quotas {
		l, ok := names.Of(&quotas[i])
		if !ok {
			continue
		}
		ns := quotas[i].Namespace
		for _, r := range []struct {
			name  v1.ResourceName
			limit int64
		}{{names.Memory, l.MemoryMiB}, {names.Cores, l.Cores}} {
			if r.limit >= 0 {
				out = append(out, QuotaUse{Namespace: ns, Quota: l.Name, Resource: string(r.name), Used: of(ns, r.name), Limit: &r.limit})
				limited[ns+"\x00"+string(r.name)] = true
			}
		}
	}
	for ns := range used {
		for _, r := range []v1.ResourceName{names.Memory, names.Cores} {
			if n := of(ns, r); n > 0 && !limited[ns+"\x00"+string(r)] {
				out = append(out, QuotaUse{Namespace: ns, Resource: string(r), Used: n})
			}
		}
	}
	slices.SortFunc(out, func(a, b QuotaUse) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Quota, b.Quota), cmp.Compare(a.Resource, b.Resource))
	})
	return out
}

// namespaceGrants is what each namespace's pods hold on candidates, as the scheduler counts
// it: bound pods' reservations (a MIG reservation's profile as its node's inventory publishes
// it) and the pods a simulation placed.
func namespaceGrants(candidates []*candidate) map[string]*placement.Grant {
	used := map[string]*placement.Grant{}
	for _, c := range candidates {
		for _, h := range c.holders {
			ns, _, _ := strings.Cut(h.pod, "/")
			if used[ns] == nil {
				used[ns] = &placement.Grant{}
			}
			used[ns].Add(h.held.Grant(c.inventory))
			used[ns].Add((&placement.Result{Assignments: h.assignments}).Grant())
		}
	}
	return used
}
