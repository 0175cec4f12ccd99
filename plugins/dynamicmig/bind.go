package dynamicmig

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
)

// Bind hands a GPU pod to its node in one write: the Binding, whose annotations carry the
// reservation signed for this pod and node. The API server merges them into the pod together
// with the node, so there is never a bound pod without its reservation. The node's device
// plugin realises the reservation at PreStartContainer, after verifying its signature. A
// failed Binding returns its error; the framework's Unreserve then releases the in-memory
// reservation. Pods without GPU requests are left to DefaultBinder.
func (pl *DynamicMIG) Bind(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeName string) *fwk.Status {
	r, ok := pl.reservations.get(pod.UID)
	if !ok {
		if _, err := readState(state); err != nil {
			return fwk.NewStatus(fwk.Skip) // PreFilter skipped it: no GPU request
		}
		return fwk.AsStatus(fmt.Errorf("pod %s/%s has no reservation to bind", pod.Namespace, pod.Name))
	}
	if r.node != nodeName {
		return fwk.AsStatus(fmt.Errorf("pod %s/%s was reserved on node %s, not %s", pod.Namespace, pod.Name, r.node, nodeName))
	}
	logger := klog.FromContext(ctx)
	key, err := pl.signingKeyFor(ctx)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("cannot sign the reservation of pod %s/%s: %w", pod.Namespace, pod.Name, err))
	}
	annotations, migRecords, err := bindingAnnotations(pod, nodeName, r.result, key)
	if err != nil {
		return fwk.AsStatus(err)
	}
	start := time.Now()
	binding := &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Annotations: annotations},
		Target:     v1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := pl.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fwk.AsStatus(fmt.Errorf("binding pod %s/%s to %s: %w", pod.Namespace, pod.Name, nodeName, err))
	}
	observeLatency(bindLatency, start)
	if migRecords != nil {
		pl.reservations.remember(annotations[api.MigReservationsAnnotation], migRecords)
	}
	pl.pending.remove(pod.UID)
	pl.relocated.finish(pod.UID)
	if v := logger.V(2); v.Enabled() {
		v.Info("Bound GPU pod", "pod", klog.KObj(pod), "node", nodeName, "devices", describe(r.result))
	}
	pl.recordBindEvents(pod, r.result)
	return nil
}

// bindingAnnotations are what the Binding carries: the reservation in its pool's format,
// signed for this pod and node, the node, the bind time and phase. For a MIG reservation it
// also returns the records as decoding the annotation gives them (decoding's order), which
// Bind memoises.
func bindingAnnotations(pod *v1.Pod, nodeName string, res *placement.Result, signingKey ed25519.PrivateKey) (map[string]string, []api.MigReservation, error) {
	a := map[string]string{
		api.AssignedNodeAnnotation: nodeName,
		api.BindTimeAnnotation:     strconv.FormatInt(time.Now().Unix(), 10),
		api.BindPhaseAnnotation:    api.BindPhaseAllocating,
	}
	// The signed payload is the reservation annotation as written here: MIG records carry no
	// runtime identity yet (api.SignedPayload).
	var key string
	var migRecords []api.MigReservation
	if res.Mode == api.ModeMIG {
		migRecords = res.MigReservations()
		api.SortMigReservations(migRecords)
		raw, err := api.EncodeMigReservations(migRecords)
		if err != nil {
			return nil, nil, fmt.Errorf("encoding the reservation of %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		key = api.MigReservationsAnnotation
		a[key] = raw
	} else {
		containers := make([][]api.HAMiCoreDevice, len(pod.Spec.InitContainers)+len(pod.Spec.Containers))
		for _, as := range res.Assignments {
			if as.ContainerIndex < len(containers) {
				containers[as.ContainerIndex] = append(containers[as.ContainerIndex], api.HAMiCoreDevice{UUID: as.GPUUUID, Type: "NVIDIA", MemoryMiB: as.MemoryMiB, Cores: as.Cores})
			}
		}
		raw := api.EncodeHAMiCoreDevices(containers)
		key = api.DevicesAllocatedAnnotation
		a[key] = raw
		a[api.DevicesToAllocateAnnotation] = raw
	}
	a[api.ReservationSignatureAnnotation] = api.Signature(signingKey, string(pod.UID), nodeName, key, a[key])
	return a, migRecords, nil
}

// recordBindEvents warns a pod whose container got more MIG devices than CUDA uses. What
// a pod got is on its reservation annotation: no Normal event says it again, since each
// event is one more write per GPU pod (kube-scheduler's Scheduled event names the node).
func (pl *DynamicMIG) recordBindEvents(pod *v1.Pod, res *placement.Result) {
	rec := pl.handle.EventRecorder()
	if rec == nil || res.Mode != api.ModeMIG {
		return
	}
	perContainer := map[int]int{}
	for _, a := range res.Assignments {
		perContainer[a.ContainerIndex]++
	}
	for idx, n := range perContainer {
		if n > 1 {
			rec.Eventf(pod, nil, v1.EventTypeWarning, "MultipleMIGDevices", "Binding",
				"container %s gets %d MIG devices, but CUDA uses one MIG device per process; run one process per device", containerName(pod, idx), n)
		}
	}
}

func containerName(pod *v1.Pod, idx int) string {
	if idx < len(pod.Spec.InitContainers) {
		return strconv.Quote(pod.Spec.InitContainers[idx].Name)
	}
	if idx -= len(pod.Spec.InitContainers); idx < len(pod.Spec.Containers) {
		return strconv.Quote(pod.Spec.Containers[idx].Name)
	}
	return strconv.Itoa(idx)
}

// describe summarises a fit: "2g.10gb on GPU-… placement [0,2), …".
func describe(res *placement.Result) string {
	parts := make([]string, len(res.Assignments))
	for i, a := range res.Assignments {
		if a.Mode == api.ModeMIG {
			parts[i] = fmt.Sprintf("%s on %s placement %s", a.Profile, a.GPUUUID, a.Placement)
		} else {
			parts[i] = fmt.Sprintf("%d MiB and %d%% cores of %s", a.MemoryMiB, a.Cores, a.GPUUUID)
		}
	}
	return strings.Join(parts, ", ")
}
