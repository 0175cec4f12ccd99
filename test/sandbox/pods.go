package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dynamig/dynamig/api"
)

// CreatePods creates the pods as the admin identity (namespace "default" when a pod names
// none) and returns them as created.
func (s *Sandbox) CreatePods(ctx context.Context, pods ...*v1.Pod) ([]*v1.Pod, error) {
	var out []*v1.Pod
	for _, p := range pods {
		p = p.DeepCopy()
		if p.Namespace == "" {
			p.Namespace = metav1.NamespaceDefault
		}
		created, err := s.admin.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return out, fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		out = append(out, created)
	}
	return out, nil
}

// WaitRunning waits until every named pod of namespace is Running and, if it has MIG
// reservations, all of them are realised (bind-phase success, MIG UUIDs written back). A
// pod that fails (admission refused it, say) ends the wait with its reason. The error of a
// timeout says what each pod still lacks.
func (s *Sandbox) WaitRunning(ctx context.Context, timeout time.Duration, namespace string, names ...string) ([]*v1.Pod, error) {
	out := make([]*v1.Pod, len(names))
	var pending []string
	var failed error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pending = pending[:0]
		for i, name := range names {
			p, err := s.admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				pending = append(pending, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			out[i] = p
			if why := notRunning(p); why != "" {
				if p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
					failed = fmt.Errorf("pod %s/%s: %s", namespace, name, why)
					return false, failed
				}
				pending = append(pending, name+": "+why)
			}
		}
		return len(pending) == 0, nil
	})
	if failed != nil {
		return out, failed
	}
	if err != nil {
		return out, fmt.Errorf("waiting %s for pods to run with realised reservations: %w; still: %s", timeout, err, strings.Join(pending, "; "))
	}
	return out, nil
}

// notRunning says why p is not running with its reservations realised; "" when it is.
func notRunning(p *v1.Pod) string {
	if p.Status.Phase == v1.PodFailed || p.Status.Phase == v1.PodSucceeded {
		return fmt.Sprintf("phase %s: %s: %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
	}
	if p.Spec.NodeName == "" {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
				return fmt.Sprintf("not scheduled: %s: %s", c.Reason, c.Message)
			}
		}
		return "not scheduled yet"
	}
	if p.Status.Phase != v1.PodRunning {
		return fmt.Sprintf("bound to %s, phase %q", p.Spec.NodeName, p.Status.Phase)
	}
	raw, ok := p.Annotations[api.MigReservationsAnnotation]
	if !ok {
		return ""
	}
	recs, err := api.DecodeMigReservations(raw)
	if err != nil {
		return err.Error()
	}
	if i := slices.IndexFunc(recs, func(r api.MigReservation) bool { return !r.Realized() }); i >= 0 {
		return fmt.Sprintf("reservation %d not realised (bind-phase %q)", i, p.Annotations[api.BindPhaseAnnotation])
	}
	return ""
}

// WaitReplicas waits until exactly want pods of namespace match selector (a label selector),
// none of them terminating, each running with its reservations realised and holding one MIG
// instance per reservation, and no MIG instance in the sandbox belongs to a pod of namespace
// that is terminating or gone: a workload's controller has scaled it, and the scheduler and the
// device plugins have caught up. The error of a timeout says what is missing.
func (s *Sandbox) WaitReplicas(ctx context.Context, timeout time.Duration, namespace, selector string, want int) ([]v1.Pod, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, err
	}
	var ready []v1.Pod
	var missing string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ready, missing = s.replicas(ctx, namespace, sel, want)
		return missing == "", nil
	})
	if err != nil {
		return ready, fmt.Errorf("waiting %s for %d pods %s of %s to run realised: %w; %s", timeout, want, selector, namespace, err, missing)
	}
	return ready, nil
}

// replicas is WaitReplicas' test: the ready pods, and what is missing ("" when nothing).
func (s *Sandbox) replicas(ctx context.Context, namespace string, sel labels.Selector, want int) (ready []v1.Pod, missing string) {
	pods, err := s.admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err.Error()
	}
	live := map[string]int{} // a pod's reservations, if it is not terminating
	var others []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			recs, _ := api.DecodeMigReservations(p.Annotations[api.MigReservationsAnnotation])
			live[p.Name] = len(recs)
		}
		if !sel.Matches(labels.Set(p.Labels)) {
			continue
		}
		why := notRunning(&p)
		if p.DeletionTimestamp != nil {
			why = "terminating"
		}
		if why != "" {
			others = append(others, p.Name+": "+why)
			continue
		}
		ready = append(ready, p)
	}
	if len(ready) != want || len(others) > 0 {
		return ready, fmt.Sprintf("%d running realised, want %d; others: %s", len(ready), want, strings.Join(others, "; "))
	}
	held := map[string]int{}
	for _, n := range s.nodes {
		if n.cfg.Mode != api.ModeMIG {
			continue
		}
		instances, err := s.Instances(n.cfg.Name)
		if err != nil {
			return ready, err.Error()
		}
		for _, in := range instances {
			if in.PodNamespace != namespace {
				continue
			}
			if _, ok := live[in.PodName]; !ok {
				return ready, fmt.Sprintf("%s's instance %s outlives its pod, deleted or terminating", n.cfg.Name, in)
			}
			held[in.PodName]++
		}
	}
	for _, p := range ready {
		if held[p.Name] != live[p.Name] {
			return ready, fmt.Sprintf("%s holds %d instances for %d reservations", p.Name, held[p.Name], live[p.Name])
		}
	}
	return ready, ""
}

// MIGPodTemplate is a pod template labelled app=app asking for one MIG device of memory MiB,
// as a user writes it: no schedulerName (the webhook sets it), the MIG mode annotation; its
// container sleeps.
func MIGPodTemplate(app string, memory int) v1.PodTemplateSpec {
	return v1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app}, Annotations: map[string]string{api.VGPUModeAnnotation: api.ModeMIG}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "ubuntu:22.04", Command: []string{"sleep", "infinity"},
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{
				api.ResourceCount:  *resource.NewQuantity(1, resource.DecimalSI),
				api.ResourceMemory: *resource.NewQuantity(int64(memory), resource.DecimalSI)}}}}},
	}
}

// MIGDeployment is a Deployment named app in namespace of replicas pods of
// MIGPodTemplate(app, memory).
func MIGDeployment(namespace, app string, replicas int32, memory int) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: namespace}, Spec: appsv1.DeploymentSpec{
		Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
		Template: MIGPodTemplate(app, memory)}}
}
