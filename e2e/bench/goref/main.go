// Command goref is a minimal reference DRA kubelet plugin on k8s.io/dynamic-resource-allocation/kubeletplugin,
// the helper library Go DRA drivers use. The plugin benchmark (e2e/bench/plugin_bench.py) runs it next to
// fracgpu's plugin to compare their per-call cost.
//
// For every claim the helper GETs from the apiserver it writes one CDI spec file (an environment variable per
// allocated device) and records the claim in a checkpoint file (temp file, fsync, rename, directory fsync);
// unprepare removes both. It registers through the kubelet's registration socket and publishes no
// ResourceSlices: the benchmark publishes them for its node.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// checkpoint is what survives a restart: per claim UID, the devices it was prepared with.
type checkpoint struct {
	Claims map[types.UID][]kubeletplugin.Device `json:"claims"`
}

type driver struct {
	name      string
	cdiDir    string
	stateFile string

	mu    sync.Mutex
	state checkpoint
}

func (d *driver) cdiKind() string { return d.name + "/gpu" }

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s.json", strings.ReplaceAll(d.name, ".", "_"), uid))
}

// writeAtomically replaces path with data: temp file, fsync, rename, fsync of the directory.
func writeAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

func (d *driver) saveLocked() error {
	data, err := json.Marshal(d.state)
	if err != nil {
		return err
	}
	return writeAtomically(d.stateFile, data)
}

// prepare writes the claim's CDI spec and returns its devices (only those allocated by this driver).
func (d *driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	spec := cdispec.Spec{Version: "0.6.0", Kind: d.cdiKind()}
	var devices []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != d.name {
			continue
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Request)
		env := fmt.Sprintf("FRACGPU_GOREF_DEVICE_%d=%s/%s", len(spec.Devices), result.Pool, result.Device)
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           name,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{env}},
		})
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{result.Request},
			PoolName:     result.Pool,
			DeviceName:   result.Device,
			CDIDeviceIDs: []string{d.cdiKind() + "=" + name},
		})
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := writeAtomically(d.specPath(claim.UID), data); err != nil {
		return nil, fmt.Errorf("write CDI spec: %w", err)
	}
	return devices, nil
}

func (d *driver) PrepareResourceClaims(
	_ context.Context, claims []*resourceapi.ResourceClaim,
) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		if devices, ok := d.state.Claims[claim.UID]; ok {
			results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
			continue
		}
		devices, err := d.prepare(claim)
		if err != nil {
			results[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		d.state.Claims[claim.UID] = devices
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	if err := d.saveLocked(); err != nil {
		return nil, fmt.Errorf("write checkpoint: %w", err)
	}
	return results, nil
}

func (d *driver) UnprepareResourceClaims(
	_ context.Context, claims []kubeletplugin.NamespacedObject,
) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := os.Remove(d.specPath(claim.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err == nil {
			delete(d.state.Claims, claim.UID)
		}
		results[claim.UID] = err
	}
	if err := d.saveLocked(); err != nil {
		return nil, fmt.Errorf("write checkpoint: %w", err)
	}
	return results, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func run() error {
	name := flag.String("driver-name", "gpu.fracgpu.dev", "DRA driver name")
	node := flag.String("node-name", "", "node this plugin serves (required)")
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (required)")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's data directory")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where CDI spec files go")
	qps := flag.Float64("kube-api-qps", -1, "client-side limit of apiserver requests per second; <0: none "+
		"(client-go's default of 5 would make a batch of 32 claims wait seconds for its GETs)")
	burst := flag.Int("kube-api-burst", 10, "client-side burst of apiserver requests, with --kube-api-qps > 0")
	flag.Parse()
	if *node == "" || *kubeconfig == "" {
		return errors.New("--node-name and --kubeconfig (or KUBECONFIG) are required")
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("read kubeconfig %s: %w", *kubeconfig, err)
	}
	restConfig.QPS, restConfig.Burst = float32(*qps), *burst
	kubeClient, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	registry := filepath.Join(*kubeletDir, "plugins_registry")
	dataDir := filepath.Join(*kubeletDir, "plugins", *name)
	for _, dir := range []string{registry, dataDir, *cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	d := &driver{name: *name, cdiDir: *cdiDir, stateFile: filepath.Join(dataDir, "checkpoint.json")}
	d.state.Claims = map[types.UID][]kubeletplugin.Device{}
	if data, err := os.ReadFile(d.stateFile); err == nil {
		if err := json.Unmarshal(data, &d.state); err != nil {
			return fmt.Errorf("read checkpoint %s: %w", d.stateFile, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(*name),
		kubeletplugin.NodeName(*node),
		kubeletplugin.KubeClient(kubeClient),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return err
	}
	<-ctx.Done()
	helper.Stop()
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "goref:", err)
		os.Exit(1)
	}
}
