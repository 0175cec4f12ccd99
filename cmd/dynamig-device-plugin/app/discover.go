package app

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/deviceplugin/inventory"
)

type discoverOptions struct {
	nvml     nvmlFlags
	config   configFlags
	nodeName string
	output   string
}

func newDiscoverCommand(opts *options) *cobra.Command {
	o := &discoverOptions{}
	cmd := &cobra.Command{
		Use:   "discover",
		Short: "Print the " + api.NodeInventoryAnnotation + " inventory this node would publish, and exit",
		Long: `Reads the GPUs through NVML, applies the device config (allowlist, nodeconfig) and prints
the node inventory the device plugin would publish: per GPU its mode and, for MIG GPUs, the
allowlisted profiles with memory, core share, instance count and legal placements.`,
		Example: `  dynamig-device-plugin discover --nvml=sim --sim-gpus=A100-40GB:2,H100-80GB:1 -o table
  dynamig-device-plugin discover --config /etc/dynamig/device-config.yaml -o json
  dynamig-device-plugin discover --config device-config.yaml --node-config node-config.json --node-name "$NODE_NAME"`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	o.nvml.register(cmd)
	o.nvml.given = opts.lib
	o.config.register(cmd)
	cmd.Flags().StringVar(&o.nodeName, "node-name", defaultNodeName(), "the node whose nodeconfig applies (default: $NODE_NAME, else the host name)")
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", `output format: "json" (the annotation's content) or "table"`)
	return cmd
}

func (o *discoverOptions) run(cmd *cobra.Command) error {
	if o.output != "json" && o.output != "table" {
		return usagef(`--output must be "json" or "table", not %q`, o.output)
	}
	cfg, err := o.config.load()
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s\n", w)
	}
	lib, err := o.nvml.open(o.nodeName, cfg.Node(o.nodeName))
	if err != nil {
		return err
	}
	defer func() {
		if err := lib.Shutdown(); err != nil {
			klog.FromContext(cmd.Context()).Error(err, "NVML shutdown")
		}
	}()
	res, err := inventory.Discover(cmd.Context(), lib, cfg, o.nodeName)
	if err != nil {
		return err
	}
	for _, f := range res.Findings {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", f)
	}
	if o.output == "json" {
		return printJSON(cmd.OutOrStdout(), res.GPUs)
	}
	return printTable(cmd.OutOrStdout(), res.GPUs)
}

func printJSON(w io.Writer, gpus []api.GPU) error {
	if err := api.ValidateInventory(gpus).ToAggregate(); err != nil {
		return fmt.Errorf("built an invalid inventory (a bug): %w", err)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(gpus)
}

func printTable(w io.Writer, gpus []api.GPU) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUUID\tTYPE\tMODE\tPROFILE\tMEMORY(MiB)\tCORE(%)\tINSTANCES\tPLACEMENTS")
	for _, g := range gpus {
		row := func(profile string, memory, core, instances int, placements string) {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", g.Index, g.ID, g.Type, g.Mode, profile, memory, core, instances, placements)
		}
		if len(g.MigProfiles) == 0 {
			row("-", g.Devmem, g.Devcore, g.Count, "-")
			continue
		}
		for _, p := range g.MigProfiles {
			pls := make([]string, len(p.Placements))
			for i, pl := range p.Placements {
				pls[i] = pl.String()
			}
			row(p.Name, p.MemoryMB, p.Core, p.Instances, strings.Join(pls, " "))
		}
	}
	return tw.Flush()
}
