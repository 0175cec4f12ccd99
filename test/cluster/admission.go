package cluster

import (
	"context"
	"fmt"
	"os"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/dynamig/dynamig/api"
)

// ApplyAdmissionPolicies creates the ValidatingAdmissionPolicies and bindings of a
// manifest (manifests/admission-policies.yaml) and waits until they refuse what they
// should: a GPU pod for another scheduler, tried as a server-side dry run.
func ApplyAdmissionPolicies(ctx context.Context, admin kubernetes.Interface, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	objs, err := DecodeManifest(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for i, obj := range objs {
		switch o := obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			err = fmt.Errorf("unexpected %T", obj)
		}
		if err != nil {
			return fmt.Errorf("%s, object %d: %w", path, i+1, err)
		}
	}
	return AwaitAdmission(ctx, admin, "admission-probe", 30*time.Second, func(_ *v1.Pod, err error) (bool, error) {
		return err != nil, nil
	})
}

// AwaitAdmission dry-runs the creation of a pod named name in namespace default that asks
// for one nvidia.com/gpu and names no scheduler, every 100 ms, until done says admission
// now answers as wanted (done's error ends the wait with it), or timeout.
func AwaitAdmission(ctx context.Context, client kubernetes.Interface, name string, timeout time.Duration, done func(*v1.Pod, error) (bool, error)) error {
	probe := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}}}}}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		return done(client.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}))
	})
}
