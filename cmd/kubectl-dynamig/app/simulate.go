package app

import (
	"fmt"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/resource"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/inspect"
)

func (o *options) simulateCommand() *cobra.Command {
	var files resource.FilenameOptions
	var described []string
	c := &cobra.Command{
		Use:   "simulate -f PODS.yaml [--nodes NAME=[COUNTx]MODEL[+…][:MODE],…]",
		Short: "Where these pods would land, one after another, on the cluster as it is now or on described nodes, with the scheduler's policy; nothing is written",
		Long: `Places the pods of the files (Pods, and the pod templates of Deployments, ReplicaSets,
StatefulSets and Jobs, one pod per replica), in the scheduler's queue order (higher
priority first, then as given), each seeing the ones placed before it, with dynamig's
own Filter and Score and kube-scheduler's filters that can be told from the objects
(unschedulable, node name, taints, node affinity and selector, CPU, memory, pods).

Without --nodes it reads the cluster: nodes, pods, heartbeats, and the ConfigMaps
dynamig-scheduler-config and dynamig-device-config. With --nodes it reads nothing from
a cluster: each node gets the inventory dynamig's device plugin publishes for those GPU
models (see kubectl dynamig models), with --device-config's allowlist or HAMi's default.

CLOSE lists nodes whose GPU score is near enough that kube-scheduler's other score
plugins (CPU and memory balance, image locality) may pick them instead.`,
		Example: `  kubectl dynamig simulate -f job.yaml
  kubectl dynamig simulate -f pods.yaml --nodes a=8xA100-40GB,b=4xH100-80GB,c=2xA100-40GB:hami-core`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.validOutput(); err != nil {
				return err
			}
			if len(files.Filenames) == 0 {
				return fmt.Errorf("-f: name the file(s) of the pods to place")
			}
			pods, err := readPods(&files)
			if err != nil {
				return err
			}
			ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
			if err != nil {
				ns = metav1.NamespaceDefault
			}
			for _, p := range pods {
				if p.Namespace == "" {
					p.Namespace = ns
				}
			}
			schedulerName := ""
			if len(pods) > 0 {
				schedulerName = pods[0].Spec.SchedulerName
			}
			var nodes []v1.Node
			var existing []v1.Pod
			var leases []coordinationv1.Lease
			var policy *inspect.Policy
			var source, where string
			if len(described) > 0 {
				desc, err := inspect.ParseNodes(described)
				if err != nil {
					return err
				}
				// No cluster is read: the policy comes from the files given, or the defaults.
				if policy, source, err = o.policy(c.Context(), nil, schedulerName); err != nil {
					return err
				}
				if nodes, leases, err = inspect.BuildNodes(c.Context(), desc, policy.Device, o.namespace, o.now()); err != nil {
					return err
				}
				where = fmt.Sprintf("%d described node(s)", len(nodes))
			} else {
				obj, err := o.read(c.Context())
				if err != nil {
					return err
				}
				if policy, source, err = o.policy(c.Context(), obj.client, schedulerName); err != nil {
					return err
				}
				nodes, existing, leases = obj.nodes, obj.pods, obj.leases
				where = fmt.Sprintf("the cluster's %d node(s) and %d pod(s) as they are now", len(nodes), len(existing))
			}
			landings := inspect.Simulate(pods, nodes, existing, leases, policy, o.now())
			if ok, err := o.print(map[string]any{"cluster": where, "policy": source, "pods": landings}); ok {
				return err
			}
			return writeLandings(o.streams.Out, landings, where, source, o.output == outputWide, o.colour())
		},
	}
	c.Flags().StringSliceVarP(&files.Filenames, "filename", "f", nil, "files, directories or URLs of the pods to place (- for stdin)")
	c.Flags().BoolVarP(&files.Recursive, "recursive", "R", false, "read the directories of -f recursively")
	c.Flags().StringSliceVar(&described, "nodes", nil, "place on these nodes instead of the cluster's: NAME=[COUNTx]MODEL[+…][:mig|hami-core], comma-separated")
	return c
}

// readPods reads the pods of files, locally (no API server): Pods as they are, and per
// replica the pod template of a Deployment, ReplicaSet, StatefulSet or Job (parallelism).
func readPods(files *resource.FilenameOptions) ([]*v1.Pod, error) {
	infos, err := resource.NewLocalBuilder().
		WithScheme(scheme.Scheme, scheme.Scheme.PrioritizedVersionsAllGroups()...).
		FilenameParam(false, files).
		Flatten().
		Do().Infos()
	if err != nil {
		return nil, err
	}
	var out []*v1.Pod
	fromTemplate := func(name, ns string, replicas int32, t *v1.PodTemplateSpec) {
		for i := range replicas {
			p := &v1.Pod{ObjectMeta: *t.ObjectMeta.DeepCopy(), Spec: *t.Spec.DeepCopy()}
			p.Name, p.Namespace = fmt.Sprintf("%s-%d", name, i), ns
			out = append(out, p)
		}
	}
	for _, info := range infos {
		switch obj := info.Object.(type) {
		case *v1.Pod:
			out = append(out, obj)
		case *appsv1.Deployment:
			fromTemplate(obj.Name, obj.Namespace, ptr.Deref(obj.Spec.Replicas, 1), &obj.Spec.Template)
		case *appsv1.ReplicaSet:
			fromTemplate(obj.Name, obj.Namespace, ptr.Deref(obj.Spec.Replicas, 1), &obj.Spec.Template)
		case *appsv1.StatefulSet:
			fromTemplate(obj.Name, obj.Namespace, ptr.Deref(obj.Spec.Replicas, 1), &obj.Spec.Template)
		case *batchv1.Job:
			fromTemplate(obj.Name, obj.Namespace, ptr.Deref(obj.Spec.Parallelism, 1), &obj.Spec.Template)
		default:
			return nil, fmt.Errorf("%s: a %s: simulate places Pods and the pod templates of Deployments, ReplicaSets, StatefulSets and Jobs", info.Source, info.Object.GetObjectKind().GroupVersionKind().Kind)
		}
	}
	return out, nil
}
