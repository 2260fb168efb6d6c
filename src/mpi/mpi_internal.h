/* mpi_internal.h - private helpers shared by the MPI component's files
 * (ring.c, encoder.c); never installed. */
#ifndef MHA_MPI_INTERNAL_H
#define MHA_MPI_INTERNAL_H

#include "internal.h"
#include "mha_mpi.h"

/* Collective: every rank of comm gets the largest status of any rank and
 * that rank's message ("rank 1: ..."); MHA_OK when every rank had MHA_OK. */
mha_status mha_mpi_agree(MPI_Comm comm, mha_status st);

#endif
