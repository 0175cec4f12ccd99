// Package signing holds the keys of signed reservations (api.Sign): the scheduler's private
// key in a Secret, created on first start when none exists, and the public keys the device
// plugins accept in a ConfigMap, which a Verifier follows with an informer.
//
// Keys are PEM: PKCS #8 for the private key, PKIX for public keys, as openssl writes them
// (`openssl genpkey -algorithm ed25519`), so an operator can bring and rotate their own.
package signing

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
)

// GenerateKey makes a new ed25519 key pair.
func GenerateKey() (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	return priv, err
}

// EncodePrivateKey is the PKCS #8 PEM of a private key.
func EncodePrivateKey(priv ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKey reads a PKCS #8 PEM ed25519 private key.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("not a PEM block of type PRIVATE KEY")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an ed25519 key", key)
	}
	return priv, nil
}

// EncodePublicKey is the PKIX PEM of a public key.
func EncodePublicKey(pub ed25519.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParsePublicKey reads a PKIX PEM ed25519 public key.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM block of type PUBLIC KEY")
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	pub, ok := key.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an ed25519 key", key)
	}
	return pub, nil
}

// PublicKeys reads the public-key ConfigMap's entries, keyed by key id. Entries not ending in
// api.PublicKeySuffix are ignored; a bad key is an error naming its entry, and so is an
// entry whose name is not its key's id (a key must not be filed under another's name).
func PublicKeys(cm *v1.ConfigMap) (map[string]ed25519.PublicKey, error) {
	keys := map[string]ed25519.PublicKey{}
	var errs []error
	for name, data := range cm.Data {
		id, ok := strings.CutSuffix(name, api.PublicKeySuffix)
		if !ok {
			continue
		}
		pub, err := ParsePublicKey([]byte(data))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("ConfigMap %s/%s, entry %s: %w", cm.Namespace, cm.Name, name, err))
		case api.KeyID(pub) != id:
			errs = append(errs, fmt.Errorf("ConfigMap %s/%s, entry %s holds key %s; name it %s%s", cm.Namespace, cm.Name, name, api.KeyID(pub), api.KeyID(pub), api.PublicKeySuffix))
		default:
			keys[id] = pub
		}
	}
	return keys, errors.Join(errs...)
}

// LoadSigningKey reads the scheduler's private key from its Secret in secretNamespace. When
// the Secret does not exist and create is set, it makes a key pair and the Secret (another
// replica racing it wins; its key is read back). Either way it then makes sure the
// public-key ConfigMap in keysNamespace carries the key's public half, so device plugins
// accept what it signs.
func LoadSigningKey(ctx context.Context, client kubernetes.Interface, secretNamespace, keysNamespace string, create bool) (ed25519.PrivateKey, error) {
	secrets := client.CoreV1().Secrets(secretNamespace)
	ref := secretNamespace + "/" + api.SigningKeySecretName
	s, err := secrets.Get(ctx, api.SigningKeySecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if !create {
			return nil, fmt.Errorf("no reservation signing key: Secret %s does not exist and createSigningKey is false; create it with the PKCS #8 PEM of an ed25519 key under %q", ref, api.SigningKeySecretKey)
		}
		s, err = createKeySecret(ctx, client, secretNamespace)
		if err == nil {
			klog.FromContext(ctx).Info("Created the reservation signing key", "secret", klog.KObj(s))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading the reservation signing key from Secret %s: %w", ref, err)
	}
	priv, err := ParsePrivateKey(s.Data[api.SigningKeySecretKey])
	if err != nil {
		return nil, fmt.Errorf("Secret %s, key %s: %w", ref, api.SigningKeySecretKey, err)
	}
	if err := publish(ctx, client, keysNamespace, priv.Public().(ed25519.PublicKey)); err != nil {
		return nil, fmt.Errorf("publishing the public key of Secret %s in ConfigMap %s/%s: %w", ref, keysNamespace, api.PublicKeysConfigMapName, err)
	}
	return priv, nil
}

func createKeySecret(ctx context.Context, client kubernetes.Interface, namespace string) (*v1.Secret, error) {
	priv, err := GenerateKey()
	if err != nil {
		return nil, err
	}
	data, err := EncodePrivateKey(priv)
	if err != nil {
		return nil, err
	}
	secrets := client.CoreV1().Secrets(namespace)
	s, err := secrets.Create(ctx, &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: api.SigningKeySecretName, Namespace: namespace},
		Type:       v1.SecretTypeOpaque,
		Data:       map[string][]byte{api.SigningKeySecretKey: data},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return secrets.Get(ctx, api.SigningKeySecretName, metav1.GetOptions{})
	}
	return s, err
}

// publish adds the public key to the ConfigMap unless it is there; other keys stay.
func publish(ctx context.Context, client kubernetes.Interface, namespace string, pub ed25519.PublicKey) error {
	data, err := EncodePublicKey(pub)
	if err != nil {
		return err
	}
	entry := api.KeyID(pub) + api.PublicKeySuffix
	cms := client.CoreV1().ConfigMaps(namespace)
	cm, err := cms.Get(ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &v1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: api.PublicKeysConfigMapName, Namespace: namespace},
			Data:       map[string]string{entry: string(data)},
		}, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		cm, err = cms.Get(ctx, api.PublicKeysConfigMapName, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	if have, ok := cm.Data[entry]; ok {
		if got, err := ParsePublicKey([]byte(have)); err == nil && got.Equal(pub) {
			return nil
		}
	}
	patch, err := json.Marshal(map[string]any{"data": map[string]string{entry: string(data)}})
	if err != nil {
		return err
	}
	_, err = cms.Patch(ctx, api.PublicKeysConfigMapName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// Verifier checks reservation signatures against the public keys of the ConfigMap, which it
// follows with an informer.
type Verifier struct {
	client    kubernetes.Interface
	namespace string

	mu   sync.RWMutex
	keys map[string]ed25519.PublicKey
	// problem says why the ConfigMap gave no keys (missing, or bad entries), for errors.
	problem string
}

// NewVerifier makes a Verifier of the public keys in namespace; Start follows them.
func NewVerifier(client kubernetes.Interface, namespace string) *Verifier {
	return &Verifier{client: client, namespace: namespace, problem: "not read yet"}
}

// NewStaticVerifier accepts exactly the given keys (tests, and callers that load keys
// themselves).
func NewStaticVerifier(keys ...ed25519.PublicKey) *Verifier {
	v := &Verifier{keys: map[string]ed25519.PublicKey{}}
	for _, k := range keys {
		v.keys[api.KeyID(k)] = k
	}
	return v
}

// Start follows the ConfigMap until ctx ends and waits for its first listing.
func (v *Verifier) Start(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(v.client, 0, informers.WithNamespace(v.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", api.PublicKeysConfigMapName).String()
		}))
	informer := factory.Core().V1().ConfigMaps().Informer()
	set := func(obj any) {
		if cm, ok := obj.(*v1.ConfigMap); ok {
			v.set(ctx, cm)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(any) { v.set(ctx, nil) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return fmt.Errorf("waiting for ConfigMap %s/%s: %w", v.namespace, api.PublicKeysConfigMapName, ctx.Err())
	}
	if len(informer.GetStore().List()) == 0 {
		v.set(ctx, nil) // say it is missing; an Add later replaces this
	}
	return nil
}

func (v *Verifier) set(ctx context.Context, cm *v1.ConfigMap) {
	keys, problem := map[string]ed25519.PublicKey{}, ""
	if cm == nil {
		problem = fmt.Sprintf("ConfigMap %s/%s does not exist", v.namespace, api.PublicKeysConfigMapName)
	} else {
		var err error
		if keys, err = PublicKeys(cm); err != nil {
			klog.FromContext(ctx).Error(err, "Reservation public keys skipped")
			problem = err.Error()
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.keys, v.problem = keys, problem
}

// UnknownKeyError is Verify's error for a signature by a key the ConfigMap does not hold
// (never did, or no longer does: a retired key).
type UnknownKeyError struct {
	KeyID string
	err   error
}

func (e *UnknownKeyError) Error() string { return e.err.Error() }

// IsUnknownKey says whether err is, or wraps, an UnknownKeyError.
func IsUnknownKey(err error) bool {
	var u *UnknownKeyError
	return errors.As(err, &u)
}

// Verify checks the pod's reservation signature: made by a key of the ConfigMap over this
// pod's UID, its node and the reservation as the scheduler wrote it. The error names the pod
// and says why.
func (v *Verifier) Verify(pod *v1.Pod) error {
	ref := pod.Namespace + "/" + pod.Name
	raw, ok := pod.Annotations[api.ReservationSignatureAnnotation]
	if !ok {
		return fmt.Errorf("pod %s carries no %s: refusing a reservation dynamig-scheduler did not sign", ref, api.ReservationSignatureAnnotation)
	}
	id, sig, err := api.ParseSignature(raw)
	if err != nil {
		return fmt.Errorf("pod %s: %w", ref, err)
	}
	v.mu.RLock()
	pub, ok := v.keys[id]
	known, problem := slices.Sorted(maps.Keys(v.keys)), v.problem
	v.mu.RUnlock()
	if !ok {
		why := fmt.Sprintf("the accepted keys are %v", known)
		if len(known) == 0 {
			why = "no key is accepted"
		}
		if problem != "" {
			why += " (" + problem + ")"
		}
		return &UnknownKeyError{KeyID: id, err: fmt.Errorf("pod %s: its reservation is signed by key %s, which is not in ConfigMap %s/%s; %s", ref, id, v.namespace, api.PublicKeysConfigMapName, why)}
	}
	key, value, err := api.SignedPayload(pod.Annotations)
	if err != nil {
		return fmt.Errorf("pod %s: %w", ref, err)
	}
	if !ed25519.Verify(pub, api.SigningMessage(string(pod.UID), pod.Spec.NodeName, key, value), sig) {
		return fmt.Errorf("pod %s: the signature of key %s does not match its reservation on node %s (changed after scheduling, or copied from another pod)", ref, id, pod.Spec.NodeName)
	}
	return nil
}
