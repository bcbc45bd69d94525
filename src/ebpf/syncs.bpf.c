// SPDX-License-Identifier: Apache-2.0 OR GPL-2.0-only
// (The kernel lets only GPL-compatible programs read kernel memory, hence
// the "GPL" license string at the end.)
//
// The time PostgreSQL's processes spend in their syncs, aggregated in the
// kernel: user space reads the histograms at its own pace, no event ever
// wakes it.
//
// - `procs` holds the tgids of each watched cluster's processes. User space
//   seeds it with the postmaster and the processes it already forked; the
//   fork hook adds every process a traced process forks (PostgreSQL forks
//   one backend per connection and its auxiliary processes from the
//   postmaster) and the exit hook drops it, so the attribution follows the
//   process tree, not a name or a cgroup that other programs may share.
// - Which file a sync is for decides its kind, not the process type: the
//   synced file's parent directory is compared with the cluster's pg_wal
//   (WAL), its grandparent with `base` or a tablespace's version directory
//   and its parent with `global` (data: relation files), anything else
//   (SLRU segments, pg_control, state files, directories) is `other`.
// - A `pwrite` counts only on a WAL file opened with O_DSYNC (O_SYNC
//   includes that bit): the write IS the WAL sync under
//   wal_sync_method = open_datasync / open_sync.
//
// Structures are declared with only the fields read, marked
// preserve_access_index: the loader relocates each offset against the
// running kernel's BTF (CO-RE), so no vmlinux.h is needed to build.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define MAX_SLOTS 64
#define KINDS 3
#define KIND_WAL 0
#define KIND_DATA 1
#define KIND_OTHER 2
// 37 bucket bounds (the exporter's probe histogram layout, set by the
// loader) plus +Inf, then the sum in ns and the count.
#define NBOUNDS 37
#define SLOTS_PER_HIST (NBOUNDS + 3)
#define O_DSYNC_BIT 010000

struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct inode *d_inode;
} __attribute__((preserve_access_index));

struct path {
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	unsigned int f_flags;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct files_struct *files;
} __attribute__((preserve_access_index));

// Written by the loader before the programs load (the .rodata section is
// frozen afterwards): the upper bounds in ns, ascending.
const volatile __u64 BOUNDS[NBOUNDS] = {};

// What user space knows of a cluster's directories: kernel device numbers
// (major << 20 | minor, as `s_dev` holds them) and inode numbers.
struct cluster_dirs {
	__u64 wal_dev;
	__u64 wal_ino;
	__u64 data_dev;
	__u64 global_ino;
	__u64 control_ino;
	__u64 active;
};

struct dir_key {
	__u64 dev;
	__u64 ino;
};

struct inflight {
	__u64 start;
	__u32 index;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u32);
	__type(value, __u32);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SLOTS);
	__type(key, __u32);
	__type(value, struct cluster_dirs);
} clusters SEC(".maps");

// `base` and each tablespace's version directory, to the cluster's slot.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct dir_key);
	__type(value, __u32);
} db_parents SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct inflight);
} started SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SLOTS * KINDS);
	__type(key, __u32);
	__type(value, __u64[SLOTS_PER_HIST]);
} hist SEC(".maps");

static __always_inline int classify(__u32 slot, __u64 fd, int want_dsync)
{
	struct cluster_dirs *c = bpf_map_lookup_elem(&clusters, &slot);
	if (!c || !c->active)
		return -1;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return -1;
	unsigned int max = BPF_CORE_READ(fdt, max_fds);
	if (fd >= max)
		return -1;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return -1;
	if (want_dsync && !(BPF_CORE_READ(f, f_flags) & O_DSYNC_BIT))
		return -1;
	struct dentry *d = BPF_CORE_READ(f, f_path.dentry);
	struct inode *ino = BPF_CORE_READ(d, d_inode);
	__u64 dev = BPF_CORE_READ(ino, i_sb, s_dev);
	__u64 file_ino = BPF_CORE_READ(ino, i_ino);
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	__u64 parent_ino = BPF_CORE_READ(parent, d_inode, i_ino);
	if (dev == c->wal_dev && parent_ino == c->wal_ino)
		return KIND_WAL;
	if (want_dsync)
		return -1;
	if (dev == c->data_dev && parent_ino == c->global_ino)
		return file_ino == c->control_ino ? KIND_OTHER : KIND_DATA;
	struct dir_key k = {
		.dev = dev,
		.ino = BPF_CORE_READ(parent, d_parent, d_inode, i_ino),
	};
	__u32 *owner = bpf_map_lookup_elem(&db_parents, &k);
	if (owner && *owner == slot)
		return KIND_DATA;
	return KIND_OTHER;
}

static __always_inline int enter(__u64 fd, int want_dsync)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u32 *slot = bpf_map_lookup_elem(&procs, &tgid);
	if (!slot)
		return 0;
	__u32 s = *slot;
	if (s >= MAX_SLOTS)
		return 0;
	int kind = classify(s, fd, want_dsync);
	if (kind < 0)
		return 0;
	struct inflight v = {
		.start = bpf_ktime_get_ns(),
		.index = s * KINDS + kind,
	};
	bpf_map_update_elem(&started, &id, &v, BPF_ANY);
	return 0;
}

static __always_inline int leave(void)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct inflight *v = bpf_map_lookup_elem(&started, &id);
	if (!v)
		return 0;
	__u64 ns = bpf_ktime_get_ns() - v->start;
	__u32 index = v->index;
	bpf_map_delete_elem(&started, &id);
	__u64 *h = bpf_map_lookup_elem(&hist, &index);
	if (!h)
		return 0;
	// Binary search for the first bound >= ns (Prometheus' `le`); NBOUNDS
	// when above every bound (+Inf).
	__u32 lo = 0, hi = NBOUNDS;
#pragma unroll
	for (int i = 0; i < 6; i++) {
		if (lo < hi) {
			__u32 mid = (lo + hi) / 2;
			if (mid < NBOUNDS && BOUNDS[mid] >= ns)
				hi = mid;
			else
				lo = mid + 1;
		}
	}
	if (lo > NBOUNDS)
		lo = NBOUNDS;
	// A per-CPU slot: no other CPU writes it, and the program is not
	// re-entered on this CPU while it runs.
	h[lo] += 1;
	h[NBOUNDS + 1] += ns;
	h[NBOUNDS + 2] += 1;
	return 0;
}

// Syscall tracepoint records: 8 bytes of common fields, the syscall
// number, then each argument in 8 bytes (offsets from the events' format
// files).
struct sys_enter_fd {
	__u64 common;
	__s32 nr;
	__u32 pad;
	__u64 fd;
};

SEC("tracepoint/syscalls/sys_enter_fdatasync")
int enter_fdatasync(struct sys_enter_fd *ctx)
{
	return enter(ctx->fd, 0);
}

SEC("tracepoint/syscalls/sys_exit_fdatasync")
int exit_fdatasync(void *ctx)
{
	return leave();
}

SEC("tracepoint/syscalls/sys_enter_fsync")
int enter_fsync(struct sys_enter_fd *ctx)
{
	return enter(ctx->fd, 0);
}

SEC("tracepoint/syscalls/sys_exit_fsync")
int exit_fsync(void *ctx)
{
	return leave();
}

SEC("tracepoint/syscalls/sys_enter_pwrite64")
int enter_pwrite64(struct sys_enter_fd *ctx)
{
	return enter(ctx->fd, 1);
}

SEC("tracepoint/syscalls/sys_exit_pwrite64")
int exit_pwrite64(void *ctx)
{
	return leave();
}

// BTF-typed tracepoints: the task pointers themselves, a layout that does
// not depend on the tracefs format (which changed in 6.x), and no tracefs.
SEC("tp_btf/sched_process_fork")
int on_fork(__u64 *ctx)
{
	struct task_struct *parent = (struct task_struct *)ctx[0];
	struct task_struct *child = (struct task_struct *)ctx[1];
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	__u32 *slot = bpf_map_lookup_elem(&procs, &ptgid);
	if (!slot)
		return 0;
	__u32 cpid = BPF_CORE_READ(child, pid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	// A new thread shares its process's entry.
	if (cpid != ctgid)
		return 0;
	__u32 s = *slot;
	bpf_map_update_elem(&procs, &ctgid, &s, BPF_ANY);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int on_exit(__u64 *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 pid = (__u32)id;
	__u32 tgid = id >> 32;
	bpf_map_delete_elem(&started, &id);
	if (pid == tgid)
		bpf_map_delete_elem(&procs, &tgid);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
