// Package dynamicmig is the DynamicMIG scheduler plugin: it reserves, for every GPU device a
// pod asks for, an exact GPU and, on MIG GPUs, the MIG profile and placement, and hands the
// reservation to the node's device plugin on the Binding. See docs/architecture.md.
package dynamicmig

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	clientset "k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	policylisters "k8s.io/client-go/listers/policy/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/placement"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
	"github.com/dynamig/dynamig/signing"
)

// Name is the plugin's name in the scheduler configuration.
const Name = "DynamicMIG"

// stateKey holds the pod's parsed request and per-node fits in the CycleState.
const stateKey fwk.StateKey = Name

var (
	_ fwk.PreFilterPlugin   = &DynamicMIG{}
	_ fwk.FilterPlugin      = &DynamicMIG{}
	_ fwk.PreScorePlugin    = &DynamicMIG{}
	_ fwk.ScorePlugin       = &DynamicMIG{}
	_ fwk.ScoreExtensions   = &DynamicMIG{}
	_ fwk.ReservePlugin     = &DynamicMIG{}
	_ fwk.BindPlugin        = &DynamicMIG{}
	_ fwk.EnqueueExtensions = &DynamicMIG{}
	_ fwk.SignPlugin        = &DynamicMIG{}
	_ fwk.PostFilterPlugin  = &DynamicMIG{}
)

// DynamicMIG is the plugin.
type DynamicMIG struct {
	handle fwk.Handle
	client clientset.Interface
	args   *config.DynamicMIGArgs
	device *config.DeviceConfig
	opts   placement.Options
	// draExtendedResources: DeviceClasses may back extended resources (fitsDeviceCount).
	draExtendedResources bool
	// signingKey signs each reservation on its Binding (api.SignReservation); loaded as the
	// plugin starts (loadSigningKey), or by a Bind before that succeeded (signingKeyFor).
	signingKeyMu sync.Mutex
	signingKey   ed25519.PrivateKey
	// leaseTimes are the device plugins' heartbeat Lease expiries per node.
	leaseTimes *leaseTimes
	// leasesRead tells when leaseTimes holds every Lease of the informer's first list: its
	// handler may run after the informer itself reports synced (seen with client-go 0.36), and
	// until then a node's heartbeat looks expired (the pods refused for it are activated as
	// the Leases arrive; tests wait for it).
	leasesRead func() bool
	// nodesRead tells when the inventories of the Node informer's first list are decoded.
	nodesRead func() bool
	inventory *inventoryCache
	// gpuNodes are the nodes with a GPU of each mode: PreFilter's result.
	gpuNodes gpuNodes
	// fits remembers each node's last fit (same request, same NodeInfo generation).
	fits *fitCache
	// reservations holds what Reserve chose for pods not yet bound with it.
	reservations *reservationCache
	// pending holds the latest scheduling attempt of the GPU pods not bound yet.
	pending *pendingPods
	// heartbeatWaiters are pods refused because a node's device plugin heartbeat expired;
	// they are activated when a heartbeat is renewed.
	heartbeatWaiters sync.Map // types.UID → *v1.Pod
	podLister        corelisters.PodLister
	// quotaLister reads the namespaces' GPU quotas (quota.go) by their names quotaNames;
	// quotaWaiting holds the pods they refused.
	quotaLister  corelisters.ResourceQuotaLister
	quotaNames   quota.Names
	quotaWaiting *quotaWaiters
	// relocated remembers the controllers whose pods were relocated (relocate.go);
	// pdbLister reads disruption budgets, where relocation is on.
	relocated *relocationLog
	pdbLister policylisters.PodDisruptionBudgetLister
}

// New builds the plugin from its args (a *config.DynamicMIGArgs, or the raw args of the
// scheduler configuration).
func New(ctx context.Context, obj runtime.Object, h fwk.Handle, fts feature.Features) (fwk.Plugin, error) {
	args, err := decodeArgs(obj)
	if err != nil {
		return nil, err
	}
	device, err := config.LoadDeviceConfig(args.DeviceConfigFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	if device.Nvidia.ResourceNames != args.ResourceNames {
		return nil, fmt.Errorf("%s: the args' resource names %+v differ from the device config's %+v; set them equal", Name, args.ResourceNames, device.Nvidia.ResourceNames)
	}
	logger := klog.FromContext(ctx)
	for _, w := range device.Warnings {
		logger.Info("Device config warning", "warning", w)
	}
	pl := &DynamicMIG{
		handle: h,
		client: h.ClientSet(),
		args:   args,
		device: device,
		opts: placement.Options{
			MIGPolicy:          args.MIGGPUSchedulerPolicy,
			HAMiCorePolicy:     args.HAMiCoreGPUSchedulerPolicy,
			FragmentationAware: *args.FragmentationAware,
			DefaultMemory:      device.Nvidia.DefaultMemory,
			DefaultCores:       device.Nvidia.DefaultCores,
			Terse:              true, // Filter asks for details only where it logs them
		},
		draExtendedResources: fts.EnableDRAExtendedResource,
		inventory:            newInventoryCache(),
		fits:                 newFitCache(),
		leaseTimes:           newLeaseTimes(),
		reservations:         newReservationCache(),
		pending:              newPendingPods(),
		quotaNames:           quota.NamesOf(args.ResourceMemoryName, args.ResourceCoreName),
		quotaWaiting:         newQuotaWaiters(),
		relocated:            newRelocationLog(),
	}
	// The heartbeat Leases: only the system namespace's Leases are watched, the node leases
	// of kube-node-lease change every 10 s on every node and are none of our business.
	informer := h.SharedInformerFactory().InformerFor(&coordinationv1.Lease{}, func(c clientset.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coordinationinformers.NewLeaseInformer(c, args.LeaseNamespace, resync, cache.Indexers{})
	})
	leaseEvents, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: pl.onLeaseAdd, UpdateFunc: pl.onLeaseUpdate, DeleteFunc: pl.onLeaseDelete})
	if err != nil {
		return nil, fmt.Errorf("%s: watching Leases: %w", Name, err)
	}
	pl.leasesRead = leaseEvents.HasSynced
	factory := h.SharedInformerFactory()
	// Inventories are decoded as their Nodes arrive, not by the first GPU pod's PreFilter:
	// kube-scheduler waits for the handlers' first sync before it schedules, so after a
	// start the scheduling loop does not stop to decode every GPU node's inventory (0.18 s
	// of CPU at 500 nodes of 8 GPUs).
	nodeEvents, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    pl.inventory.onNode,
		UpdateFunc: func(_, obj any) { pl.inventory.onNode(obj) },
		DeleteFunc: pl.inventory.onNodeDelete,
	})
	if err != nil {
		return nil, fmt.Errorf("%s: watching Nodes: %w", Name, err)
	}
	pl.nodesRead = nodeEvents.HasSynced
	pl.podLister = factory.Core().V1().Pods().Lister()
	quotas := factory.Core().V1().ResourceQuotas()
	if _, err := quotas.Informer().AddEventHandler(pl.quotaHandler()); err != nil {
		return nil, fmt.Errorf("%s: watching ResourceQuotas: %w", Name, err)
	}
	pl.quotaLister = quotas.Lister()
	if args.Relocation.Enabled {
		pl.pdbLister = factory.Policy().V1().PodDisruptionBudgets().Lister()
	}
	collector.setSource(pl, factory.Core().V1().Nodes().Lister(), pl.podLister)
	// Evict the pods a device plugin gave up on; drop in-flight reservations, scheduling
	// attempts and heartbeat waits of deleted pods. Bound pods' reservations are dropped when
	// a NodeInfo shows the pod with its annotation (addOccupancy): dropping them on the
	// informer's update could race the scheduler cache, which may still hold the assumed pod.
	evictions := newEvictor(pl.client)
	if _, err := h.SharedInformerFactory().Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    evictions.onPod,
		UpdateFunc: func(_, obj any) { evictions.onPod(obj) },
		DeleteFunc: func(obj any) {
			if p, ok := deletedObject(obj).(*v1.Pod); ok {
				pl.reservations.remove(p.UID)
				pl.pending.remove(p.UID)
				pl.heartbeatWaiters.Delete(p.UID)
				pl.quotaWaiting.remove(p)
				pl.relocated.finish(p.UID)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("%s: watching pods: %w", Name, err)
	}
	go pl.loadSigningKey(ctx)
	go evictions.run(klog.NewContext(ctx, logger.WithName(Name)))
	return pl, nil
}

// loadSigningKey reads (or, on a first start, creates) the signing key as the scheduler
// starts, retrying with backoff, so a start while the API server is briefly unreachable or
// RBAC is still being applied does not fail; until it succeeds, Bind tries too and fails GPU
// pods with the reason, and they are retried.
func (pl *DynamicMIG) loadSigningKey(ctx context.Context) {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: math.MaxInt32}
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		if _, err := pl.signingKeyFor(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "No reservation signing key yet: GPU pods are not bound until there is one")
			return false, nil
		}
		return true, nil
	})
}

// signingKeyFor returns the reservation signing key, loading it unless it is loaded.
func (pl *DynamicMIG) signingKeyFor(ctx context.Context) (ed25519.PrivateKey, error) {
	pl.signingKeyMu.Lock()
	defer pl.signingKeyMu.Unlock()
	if pl.signingKey != nil {
		return pl.signingKey, nil
	}
	key, err := signing.LoadSigningKey(ctx, pl.client, pl.args.SigningKeyNamespace, pl.args.LeaseNamespace, *pl.args.CreateSigningKey)
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Signing reservations", "keyID", api.KeyID(key.Public().(ed25519.PublicKey)))
	pl.signingKey = key
	return key, nil
}

// deletedObject is a Delete handler's object, taken out of the informer's tombstone when its
// watch missed the deletion.
func deletedObject(obj any) any {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return tomb.Obj
	}
	return obj
}

// hasReservation reports whether the pod carries a reservation of either pool.
func hasReservation(p *v1.Pod) bool {
	_, mig := p.Annotations[api.MigReservationsAnnotation]
	_, core := p.Annotations[api.DevicesAllocatedAnnotation]
	return mig || core
}

// decodeArgs accepts typed args, the raw args of a configuration file, or none.
func decodeArgs(obj runtime.Object) (*config.DynamicMIGArgs, error) {
	switch a := obj.(type) {
	case nil:
		return config.DecodeDynamicMIGArgs(nil)
	case *config.DynamicMIGArgs:
		args := a.DeepCopyObject().(*config.DynamicMIGArgs)
		args.SetDefaults()
		if err := args.Validate().ToAggregate(); err != nil {
			return nil, fmt.Errorf("invalid %s args: %w", Name, err)
		}
		return args, nil
	case *runtime.Unknown:
		return config.DecodeDynamicMIGArgs(a.Raw)
	default:
		return nil, fmt.Errorf("%s: args of type %T, want DynamicMIGArgs", Name, obj)
	}
}

// Name implements fwk.Plugin.
func (pl *DynamicMIG) Name() string { return Name }

// ScoreExtensions implements fwk.ScorePlugin.
func (pl *DynamicMIG) ScoreExtensions() fwk.ScoreExtensions { return pl }

// PreFilterExtensions implements fwk.PreFilterPlugin: occupancy is derived from the NodeInfo
// each Filter call gets, so added or removed pods need no incremental state.
func (pl *DynamicMIG) PreFilterExtensions() fwk.PreFilterExtensions { return nil }
