# Sourced by train.sbatch and tune.sbatch after slurm/common.sh: sets `launch`, the command line that starts one
# MPI job over the allocation's tasks (srun with the plugin that fits the MPI library, or the venv's mpiexec),
# and `cpus`, the cores per rank. MPITRAIN_LAUNCHER, MPITRAIN_SRUN_MPI, MPICH_CH4_NETMOD: see train.sbatch.
# Each rank sizes its thread pools itself before they start (mpitrain/base/threads.py): --cpus-per-task
# threads under srun, else the node's cores divided by its ranks. Values you exported win.
cpus=${SLURM_CPUS_PER_TASK:-1}

case ${MPITRAIN_LAUNCHER:-srun} in
  srun)
    library=$(python -c 'import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; print(MPI.Get_library_version())')
    if [ -z "${MPITRAIN_SRUN_MPI:-}" ]; then
      case $library in
        *MPICH*|*MVAPICH*|*"Intel(R) MPI"*) MPITRAIN_SRUN_MPI=pmi2 ;;
        *) MPITRAIN_SRUN_MPI=pmix ;;
      esac
    fi
    # Slurm's pmi2 plugin reads each PMI-1 request with one read of at most 1024 bytes, and MPICH's own
    # PMI client puts each node's UCX address in longer ones: on several nodes every MPI_Init fails
    # ("UCX ERROR failed to unpack address"). The addresses of MPICH's OFI netmod (libfabric: tcp,
    # verbs, psm3, efa) fit, so an MPICH that has both (the pip `mpich` extra) uses OFI there.
    device=$(sed -n 's/^MPICH Device: *//p' <<< "$library")
    if [ "$MPITRAIN_SRUN_MPI" = pmi2 ] && [ "$SLURM_JOB_NUM_NODES" -gt 1 ] && [ -z "${MPICH_CH4_NETMOD:-}" ] \
       && [[ $device == *ucx* && $device == *ofi* ]]; then
      export MPICH_CH4_NETMOD=ofi
      echo "[slurm] MPICH_CH4_NETMOD=ofi: srun --mpi=pmi2 cannot start MPICH's UCX netmod on several nodes" \
           "(see docs/slurm.md); for UCX use MPITRAIN_LAUNCHER=mpiexec"
    fi
    # srun (since Slurm 22.05) does not inherit --cpus-per-task from the batch job: pass it on.
    launch=(srun --mpi="$MPITRAIN_SRUN_MPI" --cpus-per-task="$cpus" --kill-on-bad-exit=1) ;;
  mpiexec)
    # Hydra reads the allocation's nodes and slots from Slurm and starts its proxies with srun.
    launch=(mpiexec -n "$SLURM_NTASKS") ;;
  *)
    echo "error: MPITRAIN_LAUNCHER is '$MPITRAIN_LAUNCHER', expected srun or mpiexec" >&2
    exit 2 ;;
esac
