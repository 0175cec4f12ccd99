package cluster

import (
	"context"
	"encoding/json"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
)

// RealiseAsDevicePlugin does what the device plugin does once a bound GPU pod's devices
// exist, without creating any: it sets hami.io/bind-phase success and releases the node's
// hand-off Lease if the pod still holds it. It returns the writes it made; a pod that is
// gone or a Lease already taken over is not an error.
func RealiseAsDevicePlugin(ctx context.Context, client kubernetes.Interface, p *v1.Pod) int {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.BindPhaseAnnotation: api.BindPhaseSuccess}}})
	if _, err := client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return 0 // the pod is gone, or the run is ending
	}
	return 1 + ReleaseHandoff(ctx, client, p)
}

// ReleaseHandoff clears the holder of the pod's node hand-off Lease if the pod holds it, as
// the device plugin does after the pod's last container: the one write the throughput
// benchmark's stand-in makes per GPU pod. It returns the writes it made.
func ReleaseHandoff(ctx context.Context, client kubernetes.Interface, p *v1.Pod) int {
	writes := 0
	holder := p.Namespace + "/" + p.Name + "/" + string(p.UID)
	leases := client.CoordinationV1().Leases(api.DefaultSystemNamespace)
	_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, api.HandoffLeaseName(p.Spec.NodeName), metav1.GetOptions{})
		if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != holder {
			return nil // taken over already: nothing to release
		}
		l.Spec.HolderIdentity = nil
		if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			return err
		}
		writes++
		return nil
	})
	return writes
}
