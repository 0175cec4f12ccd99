// Package publish keeps the node's GPU inventory annotation and the device plugin's
// heartbeat Lease up to date.
package publish

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/deviceplugin/inventory"
	"github.com/dynamig/dynamig/nvml"
)

// Defaults.
const (
	DefaultInventoryInterval = 30 * time.Second
	// DefaultHeartbeatInterval is how often the Lease is renewed; it expires after
	// DefaultHeartbeatDuration, so three renewals can be missed before the scheduler stops
	// sending GPU pods.
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultHeartbeatDuration = 40 * time.Second
)

// Publisher writes the inventory annotation when the Node's differs from it.
type Publisher struct {
	Client   kubernetes.Interface
	NodeName string
	NVML     nvml.Interface
	Config   *config.DeviceConfig
	// Unexplained, if set, lists per GPU UUID the MIG instances no reservation explains;
	// they are published with the inventory (api.GPU.Unexplained).
	Unexplained func(context.Context) (map[string][]api.Instance, error)
	// Unhealthy, if set, names the GPUs NVML's events made unhealthy (deviceplugin/health),
	// with the reason of each: they are published unhealthy.
	Unhealthy func() map[string]string
	// last is the value this publisher last wrote or found, to tell a content change from
	// someone else's edit in the log.
	last string
}

// Publish discovers the GPUs and patches the Node if its inventory annotation differs. It
// compares with the Node as it is now, not with its own last write, so a value someone else
// wrote (an operator, HAMi's device plugin, which writes the same key) or removed is
// restored: a read each time, a write only when the value differs. It returns the
// inventory and whether it wrote.
func (p *Publisher) Publish(ctx context.Context) (*inventory.Result, bool, error) {
	res, err := inventory.Discover(ctx, p.NVML, p.Config, p.NodeName)
	if err != nil {
		return nil, false, fmt.Errorf("discovering GPUs: %w", err)
	}
	if p.Unexplained != nil {
		unexplained, err := p.Unexplained(ctx)
		if err != nil {
			// Publishing without them would offer their placements again: wait for the next round.
			return nil, false, err
		}
		for i := range res.GPUs {
			if g := &res.GPUs[i]; g.Mode == api.ModeMIG {
				g.Unexplained = unexplained[g.ID]
			}
		}
	}
	if p.Unhealthy != nil {
		unhealthy := p.Unhealthy()
		for i := range res.GPUs {
			if g := &res.GPUs[i]; g.Health {
				if why, ok := unhealthy[g.ID]; ok {
					g.Health = false
					res.Findings = append(res.Findings, fmt.Sprintf("GPU %d (%s) is unhealthy: %s", g.Index, g.ID, why))
				}
			}
		}
	}
	raw, err := api.EncodeInventory(res.GPUs)
	if err != nil {
		return nil, false, err
	}
	node, err := p.Client.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, false, fmt.Errorf("reading node %s: %w", p.NodeName, err)
	}
	current, found := node.Annotations[api.NodeInventoryAnnotation]
	if current == raw {
		p.last = raw
		return res, false, nil
	}
	logger := klog.FromContext(ctx)
	if p.last != "" && current != p.last {
		logger.Info("The Node's GPU inventory annotation was changed or removed by someone else; restoring it", "node", klog.KObj(node),
			"annotation", api.NodeInventoryAnnotation, "found", found)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.NodeInventoryAnnotation: raw}}})
	if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.NodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, false, fmt.Errorf("publishing the inventory on node %s: %w", p.NodeName, err)
	}
	p.last = raw
	logger.Info("Published the GPU inventory", "node", klog.KObj(node), "gpus", len(res.GPUs))
	return res, true, nil
}

// Run publishes now and then every interval until ctx ends; errors are logged and retried.
func (p *Publisher) Run(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if _, _, err := p.Publish(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Inventory not published")
		}
	}, interval)
}

// Heartbeat renews the node's dynamig-heartbeat Lease.
type Heartbeat struct {
	Client    kubernetes.Interface
	NodeName  string
	Namespace string
	Duration  time.Duration
	// Clock stamps the renewals (default: the real clock).
	Clock clock.PassiveClock
}

// Renew creates or renews the Lease once.
func (h *Heartbeat) Renew(ctx context.Context) error {
	leases := h.Client.CoordinationV1().Leases(h.Namespace)
	name := api.HeartbeatLeaseName(h.NodeName)
	var c clock.PassiveClock = clock.RealClock{}
	if h.Clock != nil {
		c = h.Clock
	}
	now := metav1.NewMicroTime(c.Now())
	seconds := int32(h.Duration / time.Second)
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.Namespace},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(h.NodeName), LeaseDurationSeconds: &seconds, AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity = ptr.To(h.NodeName)
	lease.Spec.LeaseDurationSeconds = &seconds
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// Run renews every interval until ctx ends.
func (h *Heartbeat) Run(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := h.Renew(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Heartbeat Lease not renewed", "node", h.NodeName)
		}
	}, interval)
}
