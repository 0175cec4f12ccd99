package dynamicmig

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

func errNoFit(node string) error {
	return fmt.Errorf("no fit was computed for node %s in this cycle", node)
}

// Reserve records the fit Filter found on the chosen node, so that Filter sees it on the
// next pods before the Binding carries it.
func (pl *DynamicMIG) Reserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	s, err := readState(state)
	if err != nil {
		return nil // no GPU request: PreFilter skipped the pod
	}
	f, ok := s.fit(nodeName)
	if !ok {
		return fwk.AsStatus(errNoFit(nodeName))
	}
	pl.reservations.add(pod, nodeName, f.result)
	s.attempt.reserved.Store(true)
	if v := klog.FromContext(ctx).V(4); v.Enabled() {
		v.Info("Reserved GPU devices", "pod", klog.KObj(pod), "node", nodeName, "devices", describe(f.result))
	}
	return nil
}

// Unreserve forgets the pod's reservation; it is idempotent.
func (pl *DynamicMIG) Unreserve(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) {
	pl.reservations.remove(pod.UID)
	if s, err := readState(state); err == nil {
		s.attempt.reserved.Store(false)
	}
	klog.FromContext(ctx).V(4).Info("Unreserved GPU devices", "pod", klog.KObj(pod), "node", nodeName)
}
