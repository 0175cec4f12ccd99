package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/request"
)

// Invariant is one of dynamig's promises, checked against the API server, every node's
// runtime and every node's simulated hardware.
type Invariant string

// The invariants. NoOverlap must hold at every moment; the others hold once the cluster has
// caught up with a fault (the kubelet retried, the device plugin reclaimed).
const (
	NoOverlap          Invariant = "no two live pods' MIG reservations overlap on a GPU"
	RunningHasInstance Invariant = "every running container's MIG instances exist and are what its CDI spec gave it"
	NoLeak             Invariant = "every MIG instance belongs to a live pod"
)

// Violation is an invariant found broken, with what broke it.
type Violation struct {
	Invariant Invariant
	Detail    string
}

func (v Violation) String() string { return string(v.Invariant) + ": " + v.Detail }

// CheckOptions say which invariants to check.
type CheckOptions struct {
	// Settled adds RunningHasInstance and NoLeak to NoOverlap.
	Settled bool
	// Foreign are MIG UUIDs of instances a test made outside dynamig or keeps busy on
	// purpose: they are no leak.
	Foreign map[string]bool
}

// CheckInvariants reads the cluster once and returns the violations found.
func (s *Sandbox) CheckInvariants(ctx context.Context, opts CheckOptions) ([]Violation, error) {
	pods, err := s.admin.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	// The live pods' reservations: bound, not ended, not given up by the device plugin.
	type held struct {
		pod string
		r   api.MigReservation
	}
	var out []Violation
	var live []held
	var running []*v1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		raw, ok := p.Annotations[api.MigReservationsAnnotation]
		if !ok || p.Spec.NodeName == "" || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed ||
			p.Annotations[api.BindPhaseAnnotation] == api.BindPhaseFailed {
			continue
		}
		recs, err := api.DecodeMigReservations(raw)
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		for _, r := range recs {
			live = append(live, held{pod: p.Namespace + "/" + p.Name, r: r})
		}
		if p.Status.Phase == v1.PodRunning {
			running = append(running, p)
		}
	}
	for i, a := range live {
		for _, b := range live[i+1:] {
			if a.r.GPUUUID == b.r.GPUUUID && a.r.Placement.Overlaps(b.r.Placement) {
				out = append(out, Violation{NoOverlap, fmt.Sprintf("%s %s %s and %s %s %s on %s",
					a.pod, a.r.Profile, a.r.Placement, b.pod, b.r.Profile, b.r.Placement, a.r.GPUUUID)})
			}
		}
	}
	if !opts.Settled {
		return out, nil
	}

	// What the hardware holds: per MIG UUID, its GPU and placement; GIs without a CI by
	// GPU and placement.
	type where struct {
		node, gpu string
		placement api.Placement
	}
	instances := map[string]where{}
	var halfMade []where
	for _, n := range s.nodes {
		for _, g := range n.gpus.Snapshot() {
			for _, gi := range g.GpuInstances {
				w := where{node: n.cfg.Name, gpu: g.UUID, placement: gi.Placement}
				if len(gi.ComputeInstances) == 0 {
					halfMade = append(halfMade, w)
				}
				for _, ci := range gi.ComputeInstances {
					instances[ci.MigUUID] = w
				}
			}
		}
	}
	for _, w := range halfMade {
		out = append(out, Violation{NoLeak, fmt.Sprintf("a GPU instance without a compute instance at %s on %s (node %s)", w.placement, w.gpu, w.node)})
	}
	explained := map[string]bool{}
	for _, h := range live {
		if w, ok := instances[h.r.MigUUID]; ok && h.r.MigUUID != "" && w.gpu == h.r.GPUUUID && w.placement == h.r.Placement {
			explained[h.r.MigUUID] = true
		}
	}
	for uuid, w := range instances {
		if !explained[uuid] && !opts.Foreign[uuid] {
			out = append(out, Violation{NoLeak, fmt.Sprintf("%s at %s on %s (node %s) belongs to no live pod", uuid, w.placement, w.gpu, w.node)})
		}
	}

	for _, p := range running {
		recs, _ := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				continue
			}
			idx, ok := request.ContainerIndex(p, cs.Name)
			if !ok {
				continue
			}
			var want []string
			for _, r := range recs {
				if r.ContainerIndex != idx {
					continue
				}
				w, ok := instances[r.MigUUID]
				switch {
				case !r.Realized():
					out = append(out, Violation{RunningHasInstance, fmt.Sprintf("%s/%s container %s runs with its reservation %s on %s not realised", p.Namespace, p.Name, cs.Name, r.Placement, r.GPUUUID)})
				case !ok:
					out = append(out, Violation{RunningHasInstance, fmt.Sprintf("%s/%s container %s runs on %s, which NVML does not have", p.Namespace, p.Name, cs.Name, r.MigUUID)})
				case w.gpu != r.GPUUUID || w.placement != r.Placement:
					out = append(out, Violation{RunningHasInstance, fmt.Sprintf("%s/%s container %s: %s is at %s on %s, reserved %s on %s", p.Namespace, p.Name, cs.Name, r.MigUUID, w.placement, w.gpu, r.Placement, r.GPUUUID)})
				}
				want = append(want, r.MigUUID)
			}
			if len(want) == 0 {
				continue
			}
			c, ok := s.Container(p.Spec.NodeName, p.UID, cs.Name)
			if !ok {
				out = append(out, Violation{RunningHasInstance, fmt.Sprintf("%s/%s container %s runs but node %s's runtime never created it", p.Namespace, p.Name, cs.Name, p.Spec.NodeName)})
				continue
			}
			got := strings.Split(c.Env["NVIDIA_VISIBLE_DEVICES"], ",")
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				out = append(out, Violation{RunningHasInstance, fmt.Sprintf("%s/%s container %s sees NVIDIA_VISIBLE_DEVICES=%s, its reservations name %s",
					p.Namespace, p.Name, cs.Name, c.Env["NVIDIA_VISIBLE_DEVICES"], strings.Join(want, ","))})
			}
		}
	}
	return out, nil
}

// WaitInvariants waits until every invariant holds (CheckOptions.Settled), and returns the
// last violations found when timeout passes first.
func (s *Sandbox) WaitInvariants(ctx context.Context, timeout time.Duration, foreign map[string]bool) error {
	var last []Violation
	var lastErr error
	checked := false
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		v, err := s.CheckInvariants(ctx, CheckOptions{Settled: true, Foreign: foreign})
		if err != nil {
			lastErr = err
			return false, nil
		}
		last, checked = v, true
		return len(v) == 0, nil
	})
	if err == nil {
		return nil
	}
	if !checked {
		return fmt.Errorf("invariants not checked in %v: %w", timeout, lastErr)
	}
	lines := make([]string, len(last))
	for i, v := range last {
		lines[i] = v.String()
	}
	slices.Sort(lines)
	return fmt.Errorf("invariants broken after %v:\n  %s", timeout, strings.Join(lines, "\n  "))
}
