package config

import "math"

const (
	kiB = 1 << 10
	miB = 1 << 20
)

// The group and the host data plane.
var (
	StageBytes = intRow("GOSYM_STAGE_BYTES", 4*miB, 1, math.MaxInt, "", true,
		"Bytes of one staging half of the host data plane (rounded up to 4 KiB); larger messages take more rounds.")
	BoxBytes = intRow("GOSYM_BOX_BYTES", 1*miB, 1, math.MaxInt, "", true,
		"Bytes of one point-to-point mailbox half per peer on the host data plane (rounded up to 4 KiB).")
	Slots = intRow("GOSYM_SLOTS", 4, 2, 256, "", true,
		"Sync slots per rank: how many collectives' metadata a rank may publish before the slowest peer has read the oldest.")
	Threads = intRow("GOSYM_THREADS", 0, 1, math.MaxInt, "cores / ranks, from 1 to 8", false,
		"Goroutines per rank for one large host copy or reduction.")
	SpinUS = intRow("GOSYM_SPIN_US", 20, 1, math.MaxInt, "", false,
		"Microseconds a host wait polls before it sleeps on a futex.")
	WatchdogMS = intRow("GOSYM_WATCHDOG_MS", 200, 0, math.MaxInt, "", false,
		"Milliseconds between two checks of a group's watchdog, which runs once the group has CUDA work: a peer that exited without destroying the group fails the group, naming it, and aborts this rank's kernels; 0: no watchdog.")
	DirectMin = intRow("GOSYM_DIRECT_MIN", 64*kiB, 1, math.MaxInt, "", false,
		"Smallest shareable host input (bytes) that peers read in place instead of through staging; the ranks agree per op.")
	EnableUBR = enumRow("GOSYM_ENABLE_UBR", "try", []string{"try", "yes", "no"}, false, Engine,
		"User buffer registration: try (bind registered buffers where peers can map them), yes (a registered buffer peers cannot map is an error), no (never bind).")
	Debug = enumRow("GOSYM_DEBUG", "0", []string{"0", "1"}, false, Both,
		"1: debug logs to stderr, from the engine and from python/gosym.")
)

// The CUDA data plane. Its thresholds decide launch shapes and protocols
// that the ranks run together, so every rank must use the same.
var (
	GPUStageBytes = intRow("GOSYM_GPU_STAGE_BYTES", 32*miB, 1, math.MaxInt, "", true,
		"Bytes of one rank's GPU staging buffer; larger ops run in chunks of it.")
	GPUTwoShotMin = intRow("GOSYM_GPU_TWOSHOT_MIN", 4*miB, 1, math.MaxInt, "", true,
		"all_reduce chunks of at least this many bytes run two-shot (reduce-scatter then all-gather) instead of one-shot.")
	GPUBlocks = intRow("GOSYM_GPU_BLOCKS", 0, 1, math.MaxInt, "the kernels' limit (cuda.MaxBlocks, 128)", true,
		"Block limit of the bandwidth-bound kernels (chunks of at least GOSYM_GPU_TWOSHOT_MIN bytes).")
	GPUCEMin = intRow("GOSYM_GPU_CE_MIN", 8*miB, 1, math.MaxInt, "", true,
		"Staged data-movement chunks of at least this many bytes use the copy engines instead of gs_copy.")
	GPUCopyBlocks = intRow("GOSYM_GPU_COPY_BLOCKS", 64, 1, math.MaxInt, "", true,
		"Block limit of gs_copy (staged data-movement chunks below GOSYM_GPU_CE_MIN).")
	GPUDirectCEMin = intRow("GOSYM_GPU_DIRECT_CE_MIN", 32*miB, 0, math.MaxInt, "", true,
		"Data movement on the direct path uses the copy engines from this many bytes (0: always), gs_copy below.")
	GPUCEOverlapMin = intRow("GOSYM_GPU_CE_OVERLAP_MIN", 0, 1, math.MaxInt, "off, or as measured for the world and GPU (2×H200: 32 MiB; scripts/gpu_table.py)", false,
		"Copy-engine moves whose longest piece has at least this many bytes run this rank's own piece (all_gather's, all_to_all's) on a second stream beside the peers' pieces; below, one stream, one copy after another.")
	GPUDirectMin = intRow("GOSYM_GPU_DIRECT_MIN", 8*miB, 1, math.MaxInt, "", true,
		"Ops of at least this many bytes per rank (all_to_all: its longest piece) read the peers' buffers in place (the direct path) instead of staging; all_reduce from min(this, GOSYM_GPU_TWOSHOT_MIN). The per-kind thresholds below are at most this.")
	GPUMoveDirectMin = intRow("GOSYM_GPU_MOVE_DIRECT_MIN", 4*miB, 1, math.MaxInt, "", true,
		"GOSYM_GPU_DIRECT_MIN for broadcast and all_gather.")
	GPURSDirectMin = intRow("GOSYM_GPU_RS_DIRECT_MIN", 0, 1, math.MaxInt, "as measured for the world and GPU (2 MiB at 4×H200: scripts/gpu_table.py), else GOSYM_GPU_DIRECT_MIN", true,
		"GOSYM_GPU_DIRECT_MIN for reduce_scatter, in bytes of one rank's output.")
	GPURelayMin = intRow("GOSYM_GPU_RELAY_MIN", 4*miB, 1, math.MaxInt, "", true,
		"Broadcasts of at least this many bytes, at three ranks or more, run by scatter and relay (gs_bcast_relay): each non-root pulls one chunk from the root and relays it to the others, so each byte leaves the root once. Only on the direct path (from GOSYM_GPU_MOVE_DIRECT_MIN).")
	GPURelayBlocks = intRow("GOSYM_GPU_RELAY_BLOCKS", 32, 1, 128, "32, or as measured for the world, GPU and size (4×H200: 16 from 8 to 256 MiB; scripts/gpu_table.py)", true,
		"Blocks per chunk of gs_bcast_relay (its grid: this times world-1, at most 128).")
	GPURelaySlice = intRow("GOSYM_GPU_RELAY_SLICE", 512*kiB, 16, math.MaxInt, "", true,
		"The largest slice of gs_bcast_relay, in bytes: a relaying rank reads a chunk's slice once its puller published it. Slices are an eighth of a block's share, from 16 KiB up to this.")
	GPUARPush = enumRow("GOSYM_GPU_AR_PUSH", "0", []string{"0", "1"}, true, Engine,
		"1: all_reduce on the direct path runs gs_arpush (its reduce-scatter half stores into the peers' stagings and folds locally) instead of two-shot (whose reduce-scatter half loads from the peers). Off until measured.")
	GPUDefer = enumRow("GOSYM_GPU_DEFER", "0", []string{"0", "1"}, false, Engine,
		"1: an eager CUDA op that takes a host round with its peers (the direct path's agreement, an all_to_all's splits) returns to its caller at once: its stream waits on the GPU for a flag that the group's queue releases after launching the op on an internal stream, so the caller does not wait for the slowest host. Unsafe, for experiments only: while a stream waits for the worker, any module load or cudaFree in the process deadlocks it (measured, docs/ARCHITECTURE.md, Deferred ops); an FSDP2 step hangs with it. 0: the caller runs the rounds itself.")
	GPURelayPush = enumRow("GOSYM_GPU_RELAY_PUSH", "1", []string{"0", "1"}, true, Engine,
		"1: gs_bcast_relay pushes (each non-root pulls its chunk from the root once and stores it into every other non-root's output: stores cross the switch without a round trip); 0: it relays by pulls, slice by slice.")
	GPUA2AVDirectMin = intRow("GOSYM_GPU_A2AV_DIRECT_MIN", 2*miB, 1, math.MaxInt, "", true,
		"GOSYM_GPU_DIRECT_MIN for all_to_all whose splits differ between ranks.")
	GPUCaptureDirectMin = intRow("GOSYM_GPU_CAPTURE_DIRECT_MIN", 1, 1, math.MaxInt, "", true,
		"GOSYM_GPU_DIRECT_MIN for all_reduce and reduce_scatter while the stream is captured into a CUDA graph.")
	GPURegDirectMin = intRow("GOSYM_GPU_REG_DIRECT_MIN", 1*miB, 1, math.MaxInt, "", true,
		"GOSYM_GPU_DIRECT_MIN for ops on buffers registered with gosym.mem_map; registration must then be symmetric (every rank or none).")
	GPUSemaMin = intRow("GOSYM_GPU_SEMA_MIN", math.MaxInt, 1, math.MaxInt, "off", true,
		"Reductions of at least this many bytes use the semaphore protocol with the unicast pull kernel.")
	GPUFuseMax = intRow("GOSYM_GPU_FUSE_MAX", 4*miB, 1, math.MaxInt, "", true,
		"One-shot chunks of at most this many bytes stage inside the reduce kernel (outside graph capture).")
	GPULLMax = intRow("GOSYM_GPU_LL_MAX", 256*kiB, 0, math.MaxInt, "", true,
		"all_reduce of at most this many bytes, and broadcast, all_gather, gather, scatter, reduce_scatter and equal-split all_to_all of at most this many bytes per segment, run one low-latency (LL) launch; 0: never; capped at 512 KiB (the LL area).")
	GPUA2AVBlocks = intRow("GOSYM_GPU_A2AV_BLOCKS", 0, 0, math.MaxInt, "0, or as measured for the world and GPU (64 on 2xH200; scripts/gpu_table.py)", true,
		"Blocks per pair and direction of gs_a2av, the all_to_all of differing splits without a host round; 0 agrees on the splits on the host instead (set to 0, it does so where a measurement would choose gs_a2av). Under CUDA graph capture the splits are always agreed on the host (once, at capture). Capped by what the GPU holds resident.")
	GPUA2APacedMin = intRow("GOSYM_GPU_A2A_PACED_MIN", 0, 0, math.MaxInt, "0, or as measured for the world and GPU (2xH200: see scripts/gpu_table.py)", true,
		"all_to_all of equal splits whose input has at least this many bytes per rank runs gs_a2av (where GOSYM_GPU_A2AV_BLOCKS is on) instead of the direct path's copy engines; 0: never. On 2xH200, 1 GiB took 1498 us on gs_a2av against 1618-1652 on the copy engines (NCCL 1616). Not under CUDA graph capture.")
	GPUA2AVPush = enumRow("GOSYM_GPU_A2AV_PUSH", "1", []string{"0", "1"}, true, Engine,
		"1: gs_a2av's senders store each chunk into the receiver's staging over the link and the receiver copies it out locally (measured on 2xH200: as fast or faster at every size, 0.74x the time from 64 MiB); 0: the sender stages locally and the receiver loads over the link.")
	GPUA2AVSlotBytes = intRow("GOSYM_GPU_A2AV_SLOT_BYTES", 256*kiB, 1, math.MaxInt, "", true,
		"Slot bytes of gs_a2av (see GOSYM_GPU_A2AV_BLOCKS), at most what its blocks' two slots each leave of a region (GOSYM_GPU_STAGE_BYTES over world-1: 256 KiB at two ranks in the default staging). Longer slots move large pieces faster: on 2xH200, 64 blocks, pushing, 1 GiB took 2784 us in two slots of 256 KiB against 2892 in four of 128 KiB (NCCL 2806).")
	GPUP2PSlotBytes = intRow("GOSYM_GPU_P2P_SLOT_BYTES", 128*kiB, 1, math.MaxInt, "", true,
		"Outbox slot of one block of a CUDA send/recv channel (rounded down to a multiple of 16, at least 16).")
	GPUSemaWait = enumRow("GOSYM_GPU_SEMA_WAIT", "kernel", []string{"kernel", "memop"}, false, Engine,
		"How the semaphore protocol waits: kernel (gs_sema_wait, with the group's deadline) or memop (stream memory operations: one launch less, but no deadline).")
	GPUPDL = enumRow("GOSYM_GPU_PDL", "0", []string{"0", "1"}, false, Engine,
		"1: the engine's kernels launch with programmatic stream serialization (cuLaunchKernelEx) where the GPU is sm_90 or newer and the driver CUDA 12.3 or newer: a kernel may start while the previous kernel of its stream runs and waits for it on the device, which saves part of each small op's launch gap in a CUDA graph; 0: plain launches. Off until measured across NVLink (scripts/device_cuda.sh graphab with GOSYM_AB_ENVS).")
	NVLS = enumRow("GOSYM_NVLS", "0", []string{"0", "1"}, false, Engine,
		"1 opts in to NVLink SHARP (multicast), used only where the device supports it and none of NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 is set; the ranks agree on the gate's answer.")
	LibCUDA = textRow("GOSYM_LIBCUDA", "libcuda.so.1", Engine,
		"Path of the CUDA driver library to load.")
	NVRTC = textRow("GOSYM_NVRTC", "a loaded libnvrtc, the sonames, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda", Engine,
		"Path of the NVRTC library (nothing else is tried when it is set).")
	KernelCache = textRow("GOSYM_KERNEL_CACHE", "$XDG_CACHE_HOME/gosym/kernels, else ~/.cache/gosym/kernels", Engine,
		"Directory of the compiled-kernel cache.")
)

// Read by Python, the build and the tests. The engine never reads them.
var (
	_ = textRow("GOSYM_HOST_ID", "hostname, boot id, network and pid namespaces", Python,
		"The host a rank is on: ranks with the same id form one gosym group inside a host, linked across hosts by Gloo (CPU) or NCCL (CUDA). Set one value per host where the detection cannot tell hosts apart. For tests, ranks-per-host:K puts global rank g on simulated host g // K with one environment for every process (torch's own suite across hosts).")
	_ = pyIntRow("GOSYM_HIER_RAIL_MIN", 64*kiB, 1,
		"Across hosts of equal rank counts, all_reduce, reduce_scatter and all_gather of at least this many bytes run per local index (each rank moves 1/n between hosts); smaller ones, and all on unequal hosts, go through each host's first rank.")
	_ = pyIntRow("GOSYM_HIER_CHUNK", 4*miB, 4096,
		"Chunk bytes of the pipelined all_reduce across hosts: one chunk's inter-host step overlaps the next chunk's intra-host reduce-scatter.")
	_ = pyIntRow("GOSYM_HIER_SWAP_MAX", 4*miB, 0,
		"Host tensors across hosts: an all_reduce whose bytes times the other hosts' count are at most this moves along each rail as point-to-point sends to every other host per chunk, each rank folding what it receives in host order (larger ones: Gloo's all_reduce per chunk, which reduces on its own threads).")
	_ = pyIntRow("GOSYM_HIER_REPORT_S", 5, 0,
		"After a failure across hosts, seconds a rank waits for the others to report it; the ranks that do not are named as lost.")
	_ = enumRow("GOSYM_HIER_CHOICE", "table", []string{"table", "hier", "flat"}, false, Python,
		"Across hosts, whether all_reduce, all_gather, reduce_scatter, broadcast and reduce take the hierarchical schedule or run flat on the inter-host engine (Gloo, NCCL) over every rank: table (per op, size and hosts x ranks per host from the measurements in python/gosym/hier/measured.py; flat where none was measured), hier (always hierarchical) or flat (always flat). Every rank must use the same.")
	_ = enumRow("GOSYM_HIER_LINK", "auto", []string{"auto", "loopback", "network"}, false, Python,
		"Across hosts, the link between them whose measurements GOSYM_HIER_CHOICE=table takes (python/gosym/hier/measured.py has entries per link): loopback (hosts on one machine, one kernel, where the traffic between hosts is memory copies: simulated hosts), network (hosts joined by a link slower than their memory, where what crosses between hosts bounds an op: real hosts), or auto (loopback where every rank reports the same boot id, else network). An entry of the other link stands in where the group's link has none. Every rank must use the same.")
	_ = enumRow("GOSYM_HIER_CPU_P2P", "gloo", []string{"gloo", "local"}, false, Python,
		"Across hosts, how sends and receives of CPU tensors travel: gloo (every pair through the inter-host Gloo group, as a Gloo group does it: recv from any source works on every rank) or local (two ranks of one host through gosym's shared memory, faster, but a rank that shares its host cannot receive from any source: its host's senders and the others' take different transports). Every rank must use the same.")
	_ = textRow("GOSYM_LIBRARY", "libgosym.so in the package", Python,
		"Path of the libgosym.so that python/gosym loads.")
	_ = enumRow("GOSYM_C10D", "1", []string{"0", "1"}, false, Python,
		"1: a group on one host is handed to torch as gosym._c10d's C++ backend where that module is built for the running torch (`make lib`), so dist.<op> reaches its short path without Python, and a group across hosts as its Hier backend (the ops it runs flat issued from C++: on CUDA tensors, and synchronous ones on host tensors; not under TORCH_DISTRIBUTED_DEBUG=DETAIL); 0: torch gets the Python group itself.")
	_ = enumRow("GOSYM_PROFILER_RANGES", "1", []string{"0", "1"}, false, Python,
		"1: every op records a gosym:<op> range while torch's profiler runs (python/gosym/profiling.py); 0: the op methods are not wrapped (no ranges, not the wrapper's cost).")
	_ = textRow("GOSYM_VENV", "~/.cache/gosym/venv-<hash of the requirements>", Build,
		"Where `make venv` puts the development venv.")
	_ = textRow("GOSYM_GO_FLAGS", "", Build,
		"Extra `go build` flags for the pip build (setup.py), e.g. -mod=vendor.")
	_ = textRow("GOSYM_PYTEST_K", "", Build,
		"A pytest -k filter for scripts/device_cuda.sh.")
	_ = textRow("GOSYM_PYTEST_TIMEOUT", "450", Build,
		"Seconds each test of scripts/device_cuda.sh test may run (pytest-timeout).")
	_ = textRow("GOSYM_CONFORM_BACKENDS", "nccl gosym", Build,
		"The backends scripts/device_cuda.sh conform runs, space-separated; gosym alone compares with NCCL's committed outcomes (tests/jobs/conformance/expected).")
	_ = textRow("GOSYM_CONFORM_SHARDS", "3", Build,
		"Shards per backend and world size of scripts/device_cuda.sh conform (all run at once).")
	_ = textRow("GOSYM_CONFORM_S", "480", Build,
		"Seconds each shard of scripts/device_cuda.sh conform may run (it keeps the tests it finished).")
	_ = textRow("GOSYM_CONFORM_WORLDS", "2, and 4 on 4 GPUs", Build,
		"The world sizes scripts/device_cuda.sh conform runs, space-separated (one call per world where both do not fit).")
	_ = textRow("GOSYM_CONFORM_K_FILE", "", Build,
		"A file holding a -k pattern for scripts/device_cuda.sh conform (a rerun of some tests).")
	_ = textRow("GOSYM_HOSTBENCH_RUNS", "3", Build,
		"Runs of scripts/device_cuda.sh hostbench (the across-hosts bench on simulated hosts), each its own JSON.")
	_ = textRow("GOSYM_CPUHOST_SHAPES", "2,2:3 4,4:1", Build,
		"The shapes and runs of scripts/device_cuda.sh cpuhostbench: ranks per host comma-joined, a colon, the runs; space-separated (2,2,2:2 is 3 hosts of 2 ranks, twice).")
	_ = textRow("GOSYM_CPUHOST_OPS", "all_reduce,all_gather_into_tensor,reduce_scatter_tensor,broadcast,all_to_all_single", Build,
		"The ops of scripts/device_cuda.sh cpuhostbench and cpubench (gosym.bench's --ops).")
	_ = textRow("GOSYM_CPUHOST_SIZES", "1K,4K,16K,64K,256K,1M,4M,16M,64M", Build,
		"The sizes of scripts/device_cuda.sh cpuhostbench and cpubench (gosym.bench's --sizes).")
	_ = textRow("GOSYM_CPUHOST_INTERLEAVE", "5", Build,
		"The turns of scripts/device_cuda.sh cpuhostbench (gosym.bench's --interleave): its backends take alternating turns of about this many samples of a case (0: one backend's samples after another's).")
	_ = textRow("GOSYM_CPUHOST_ENV", "default", Build,
		"Settings scripts/device_cuda.sh cpuhostbench and cpubench sweep: space-separated jobs, each NAME=VALUE joined by + (default: none), its file named by them.")
	_ = textRow("GOSYM_FLATCOST_HOSTS", "2,2 4,4", Build,
		"The shapes of scripts/device_cuda.sh flatcost's runs against a plain Gloo group (scripts/hier_flat_cost.py --gloo) and of its switchcost's (scripts/switch_cost.py): ranks per host comma-joined, space-separated.")
	_ = textRow("GOSYM_PROFILE_OPS", "all_reduce:1M,4M broadcast:4K", Build,
		"What scripts/device_cuda.sh cpuhostprofile profiles (scripts/hier_profile.py): op:sizes, space-separated.")
	_ = textRow("GOSYM_PROFILE_HOSTS", "2,2", Build,
		"The shapes scripts/device_cuda.sh cpuhostprofile profiles on: ranks per host comma-joined, space-separated.")
	_ = textRow("GOSYM_LOST_HOSTS", "2,2 1,1", Build,
		"The shapes of scripts/device_cuda.sh lost-probe (a rank lost on CUDA across hosts, the second host's first rank): ranks per host comma-joined, space-separated.")
	_ = textRow("GOSYM_LOST_CHUNK", "4096", Build,
		"The rails' chunk in bytes (GOSYM_HIER_CHUNK) of scripts/device_cuda.sh lost-probe's runs, test_hier's by default; empty: the setting's default.")
	_ = textRow("GOSYM_HIER_STEPS", "1", Build,
		"0: scripts/device_cuda.sh cpuhostbench skips scripts/hier_steps.py (what each step of an op across hosts costs).")
	_ = textRow("GOSYM_A2AV_MODES", "host pull push push64", Build,
		"The modes of the skewed all_to_all that scripts/device_cuda.sh a2av measures, space-separated: host (agreed on the host), pull, push (gs_a2av), push64 (pushing in a 64 MiB staging); a suffix -nbN sets gs_a2av's blocks per pair.")
	_ = textRow("GOSYM_PROBE_MIB", "256", Build,
		"MiB per piece of scripts/device_cuda.sh nvswitch (the NVSwitch copy probe).")
	_ = textRow("GOSYM_FUZZ_SEED", "101", Build,
		"The seed of scripts/device_cuda.sh fuzz-slow.")
	_ = textRow("GOSYM_FUZZ_THREADS", "1", Build,
		"Programs at once (threads) per rank in scripts/device_cuda.sh fuzz-slow, fuzz-seeds and fuzz-hosts.")
	_ = textRow("GOSYM_FUZZ_GROUPS", "3", Build,
		"Random subgroups besides the world in scripts/device_cuda.sh fuzz-seeds.")
	_ = textRow("GOSYM_FUZZ_S", "240", Build,
		"Seconds scripts/device_cuda.sh fuzz-slow may run (fuzz-seeds: each run, default 90; fuzz-hosts: each run, default 240).")
	_ = textRow("GOSYM_CUDACHECK", "build/cudacheck", Build,
		"The cudacheck binary scripts/gpu_check.sh runs.")
	_ = textRow("GOSYM_TEST_OUT", "a per-test directory", Tests,
		"Where a test's workers write their results (set by tests/conftest.py).")
	_ = textRow("GOSYM_CONFORMANCE_RUNTIME", "the reference backend", Tests,
		"The backend whose process groups torch's suite creates in tests/jobs/conformance (set by run_dist_suite.py --backend).")
	_ = textRow("GOSYM_CONFORMANCE_PORT", "a free port", Tests,
		"The MASTER_PORT of torch's suite in tests/jobs/conformance (a few tests rendezvous on the port above it; set by run_dist_suite.py).")
	_ = enumRow("GOSYM_CONFORMANCE_HOSTS", "0", []string{"0", "1"}, false, Tests,
		"1: tests/jobs/conformance/test_conformance.py also runs torch's suite on gosym across simulated hosts (GOSYM_HOST_ID=ranks-per-host) at world 3 (hosts of 2 and 1 ranks), against gloo's outcomes; world 2 (1+1) always runs.")
	_ = enumRow("GOSYM_CONFORMANCE_REFERENCE", "0", []string{"0", "1"}, false, Tests,
		"1: tests/jobs/conformance/test_conformance.py also checks gloo's outcomes at world 3 against the committed ones (world 2 always).")
	_ = textRow("GOSYM_FUZZ_SEEDS", "101,202", Tests,
		"tests/jobs/fuzz/test_fuzz.py's seeds, comma-separated: each runs one random program (fuzz_worker.py) per world. scripts/device_cuda.sh fuzz-seeds: the seeds it runs at every GPU (default 1000 to 1019); fuzz-hosts: the seeds it runs across two simulated hosts (default 303).")
	_ = textRow("GOSYM_FUZZ_OPS", "300", Tests,
		"The number of ops in each of tests/jobs/fuzz/test_fuzz.py's random programs.")
	_ = textRow("GOSYM_TEST_RANKS_PER_GPU", "1", Tests,
		"The tests' GPU jobs put this many ranks on each GPU (their worlds that many times the GPUs; NCCL's reference groups then see a host per rank): one GPU runs them at world 2 and more, for every path's logic, not its speed.")
	_ = textRow("GOSYM_TEST_STACKS_EVERY", "", Tests,
		"Seconds: every test worker then writes every thread's Python stack to its log this often (faulthandler), to see where a job that hangs waits before its deadline kills it.")
	_ = textRow("GOSYM_TEST_BACKEND", "gosym", Tests,
		"gloo runs the pytest workers on gloo: a check of the tests themselves.")
	_ = textRow("GOSYM_TEST_FAKE_CUDA", "", Tests,
		"Set by the Go tests in the child process that runs on the fake CUDA driver.")
	_ = textRow("GOSYM_CUDA_INCLUDE", "beside GOSYM_NVRTC, or $CUDA_HOME/include", Tests,
		"Directory of cuda.h for the Go test that checks the driver ABI.")
	_ = textRow("GOSYM_WRITE_FUZZ_SEEDS", "", Tests,
		"1 rewrites memreg's fuzz seed corpus (after a blob format change).")
	_ = textRow("GOSYM_MEMREG_HELPER", "", Tests,
		"Set by memreg's tests in their helper process.")
	_ = textRow("GOSYM_MEMREG_BLOB", "", Tests,
		"The blob memreg's tests hand their helper process.")
	_ = textRow("GOSYM_CLIENTS_GROUP_TIMEOUT", "60", Tests,
		"Seconds: the group timeout inside the real-client test jobs (tests/jobs/clients).")
	_ = textRow("GOSYM_CLIENTS_JOB_TIMEOUT", "400", Tests,
		"Seconds: the launcher's deadline for one real-client test job (tests/jobs/clients).")
	_ = textRow("GOSYM_AB_LIBS", "GOSYM_LIBRARY", Build,
		"The libgosym.so files scripts/device_cuda.sh graphab compares, colon-joined, each timed in turn (captured small ops), twice.")
	_ = textRow("GOSYM_AB_ENVS", "default", Build,
		"The settings scripts/device_cuda.sh graphab times each library under, space-separated: default, or NAME=VALUE joined by + (\"default GOSYM_GPU_PDL=1\").")
	_ = textRow("GOSYM_CLIENTS_SHARDS", "", Tests,
		"How many reference/gosym job pairs run a (device, world) pair's real-client scenarios at once (tests/jobs/clients/harness.py; empty: 3 on CUDA, 1 on CPU).")
	_ = textRow("GOSYM_CLIENTS_WORLDS", "", Build,
		"The worlds scripts/device_cuda.sh clients runs, space-separated (empty: 2 up to the GPUs there), one pytest each.")
	_ = textRow("GOSYM_CLIENTS_S", "520", Build,
		"Seconds scripts/device_cuda.sh clients gives each world's pytest.")
	_ = textRow("GOSYM_CLIENTS_SCENARIO_TIMEOUT", "150", Tests,
		"Seconds one real-client scenario may run before its job reports it hung by name and resumes after it.")
	_ = textRow("GOSYM_FUZZ_SLOW_S", "", Tests,
		"The fuzzer names every step slower than this many seconds (and every 100th), on stderr.")
	_ = textRow("GOSYM_FUZZ_TRACE", "", Tests,
		"1: the fuzzer names every step as it starts, on stderr (where a run stalls).")
	_ = textRow("GOSYM_FUZZ_STACKS_S", "", Tests,
		"The fuzzer prints every thread's Python stack once after this many seconds, if still running, and (on gosym) the engine's goroutines (gosym_debug_stacks). scripts/device_cuda.sh fuzz-hosts sets it (default 150).")
	_ = textRow("GOSYM_FUZZ_TURNS", "", Tests,
		"1: the fuzzer's threaded programs post by turns on the CPU too (on CUDA they always do, unless --free-threads): the same posting order on every rank.")
	_ = textRow("GOSYM_FUZZ_BACKEND", "gosym", Tests,
		"scripts/device_cuda.sh fuzz-slow: the backend the fuzzer runs on (nccl: the same program on NCCL).")
	_ = textRow("GOSYM_STARTBENCH_OUT", "", Tests,
		"Where python -m gosym.startbench's ranks write their times (set by it).")
	_ = textRow("GOSYM_STEPBENCH_OUT", "", Tests,
		"Where python -m gosym.stepbench's ranks write their step times and losses (set by it).")
	_ = textRow("GOSYM_CALLCOST_OUT", "", Tests,
		"Where python -m gosym.callcost's ranks write their times (set by it).")
	_ = textRow("GOSYM_CLIENTS_COMPILE", "inductor on CUDA, aot_eager on CPU", Tests,
		"The torch.compile backend of the real-client tests' compiled scenarios.")
)
