// Open MPI peer of `loom-perf allreduce`: MPI_Allreduce timed the same way (per size: warm
// up, barrier, time `iters` calls, slowest rank's average; then one checked call), with
// the same columns (out of place, and in place via MPI_IN_PLACE), busbw factor 2(n-1)/n
// and JSON shape (see tools/loom_perf/report.h).
//
//   mpirun --oversubscribe --allow-run-as-root -np 2 ./mpi_allreduce_perf -b 8 -e 256M
//
// Flags (a subset of nccl-tests'): -b -e (K/M/G suffixes) -f -n -w -c -d float|double,
// --json FILE.

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  size_t min_bytes, max_bytes;
  double step_factor;
  int iters, warmup_iters, check;
  int is_double;
  const char* json_path;
} Options;

typedef struct {
  double time_us, algbw, busbw;
  long long wrong;  // -1: not checked
} Cell;

typedef struct {
  size_t bytes, count;
  Cell oop, ip;
} Row;

static int parse_bytes(const char* text, size_t* out) {
  char* end = NULL;
  unsigned long long value = strtoull(text, &end, 10);
  if (end == text) return 0;
  int shift = 0;
  if (*end == 'K' || *end == 'k')
    shift = 10, ++end;
  else if (*end == 'M' || *end == 'm')
    shift = 20, ++end;
  else if (*end == 'G' || *end == 'g')
    shift = 30, ++end;
  if (*end == 'i') ++end;
  if (*end == 'B') ++end;
  if (*end != '\0') return 0;
  *out = (size_t)value << shift;
  return 1;
}

static void usage_exit(int rank, const char* message) {
  if (rank == 0) {
    fprintf(stderr,
            "mpi_allreduce_perf: %s\nusage: mpi_allreduce_perf [-b 8] [-e 64M] [-f 2] [-n 20] "
            "[-w 5] [-c 1] [-d float|double] [--json FILE]\n",
            message);
  }
  MPI_Finalize();
  exit(2);
}

static Options parse_options(int argc, char** argv, int rank) {
  Options o = {8, (size_t)64 << 20, 2.0, 20, 5, 1, 0, NULL};
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    if (i + 1 >= argc) usage_exit(rank, "every flag takes a value");
    const char* value = argv[++i];
    if (!strcmp(flag, "-b") || !strcmp(flag, "--minbytes")) {
      if (!parse_bytes(value, &o.min_bytes)) usage_exit(rank, "bad -b size");
    } else if (!strcmp(flag, "-e") || !strcmp(flag, "--maxbytes")) {
      if (!parse_bytes(value, &o.max_bytes)) usage_exit(rank, "bad -e size");
    } else if (!strcmp(flag, "-f") || !strcmp(flag, "--stepfactor")) {
      o.step_factor = atof(value);
      if (o.step_factor <= 1.0) usage_exit(rank, "-f must be above 1");
    } else if (!strcmp(flag, "-n") || !strcmp(flag, "--iters")) {
      o.iters = atoi(value);
    } else if (!strcmp(flag, "-w") || !strcmp(flag, "--warmup_iters")) {
      o.warmup_iters = atoi(value);
    } else if (!strcmp(flag, "-c") || !strcmp(flag, "--check")) {
      o.check = atoi(value);
    } else if (!strcmp(flag, "-d") || !strcmp(flag, "--datatype")) {
      if (!strcmp(value, "float") || !strcmp(value, "f32"))
        o.is_double = 0;
      else if (!strcmp(value, "double") || !strcmp(value, "f64"))
        o.is_double = 1;
      else
        usage_exit(rank, "-d takes float or double");
    } else if (!strcmp(flag, "--json")) {
      o.json_path = value;
    } else {
      usage_exit(rank, "unknown flag");
    }
  }
  if (o.iters < 1) o.iters = 1;
  return o;
}

// Element j of rank r holds g((3 j + 5 r + seed) mod 7) = that residue + 1, as loom-perf.
static void fill(void* data, int is_double, size_t count, int rank, unsigned seed) {
  size_t k = (5 * (size_t)rank + seed) % 7;
  for (size_t i = 0; i < count; ++i) {
    if (is_double)
      ((double*)data)[i] = (double)(k + 1);
    else
      ((float*)data)[i] = (float)(k + 1);
    k = (k + 3) % 7;
  }
}

static long long count_wrong(const void* data, int is_double, size_t count, int nranks,
                             unsigned seed) {
  double expected[7];
  for (int k = 0; k < 7; ++k) {
    expected[k] = 0;
    for (int r = 0; r < nranks; ++r)
      expected[k] += (double)((k + 5 * r) % 7 + 1);
  }
  long long wrong = 0;
  size_t k = seed % 7;
  for (size_t i = 0; i < count; ++i) {
    double got = is_double ? ((const double*)data)[i] : (double)((const float*)data)[i];
    if (got != expected[k]) ++wrong;
    k = (k + 3) % 7;
  }
  return wrong;
}

static Cell measure(const Options* o, void* send, void* recv, size_t count, int in_place, int rank,
                    int nranks, unsigned seed) {
  MPI_Datatype type = o->is_double ? MPI_DOUBLE : MPI_FLOAT;
  const void* source = in_place ? MPI_IN_PLACE : send;
  void* target = in_place ? send : recv;
  const size_t bytes = count * (o->is_double ? 8 : 4);
  Cell cell;
  fill(send, o->is_double, count, rank, seed);
  for (int i = 0; i < o->warmup_iters; ++i) {
    MPI_Allreduce(source, target, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  for (int i = 0; i < o->iters; ++i) {
    MPI_Allreduce(source, target, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
  }
  double local_us = (MPI_Wtime() - start) * 1e6 / o->iters;
  MPI_Allreduce(&local_us, &cell.time_us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  cell.algbw = cell.time_us > 0 ? (double)bytes / cell.time_us / 1e3 : 0.0;
  cell.busbw = cell.algbw * 2.0 * (nranks - 1) / nranks;
  cell.wrong = -1;
  if (o->check) {
    fill(send, o->is_double, count, rank, seed + 1000);
    if (!in_place) memset(recv, 0xAB, bytes);
    MPI_Allreduce(source, target, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
    long long wrong = count_wrong(target, o->is_double, count, nranks, seed + 1000);
    MPI_Allreduce(&wrong, &cell.wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  }
  return cell;
}

static void time_text(char* text, size_t size, double us) {
  if (us >= 10000.0)
    snprintf(text, size, "%7.0f", us);
  else if (us >= 100.0)
    snprintf(text, size, "%7.1f", us);
  else
    snprintf(text, size, "%7.2f", us);
}

static void print_cell(const Cell* c) {
  char time[32], wrong[32];
  time_text(time, sizeof time, c->time_us);
  if (c->wrong >= 0)
    snprintf(wrong, sizeof wrong, "%5lld", c->wrong);
  else
    snprintf(wrong, sizeof wrong, "  N/A");
  printf("  %7s  %6.2f  %6.2f  %5s", time, c->algbw, c->busbw, wrong);
}

static void json_cell(FILE* f, const char* name, const Cell* c) {
  fprintf(f, "\"%s\": {\"time_us\": %.6f, \"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f, ", name,
          c->time_us, c->algbw, c->busbw);
  if (c->wrong >= 0)
    fprintf(f, "\"wrong\": %lld}", c->wrong);
  else
    fprintf(f, "\"wrong\": null}");
}

static void json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s; ++s) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s >= 0x20) fputc(*s, f);
  }
  fputc('"', f);
}

static void write_json(const Options* o, const Row* rows, int n_rows, int nranks,
                       const char* command, const char* date, const char* host, double avg,
                       long long wrong) {
  FILE* f = fopen(o->json_path, "w");
  if (!f) {
    fprintf(stderr, "mpi_allreduce_perf: cannot write %s\n", o->json_path);
    return;
  }
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  char library[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(library, &length);
  char* newline = strchr(library, ',');
  if (newline) *newline = '\0';
  fprintf(f,
          "{\n  \"metadata\": {\"implementation\": \"openmpi\", \"collective\": \"allreduce\", ");
  fprintf(f, "\"nranks\": %d, \"backend\": ", nranks);
  json_string(f, library);
  fprintf(f, ", \"dtype\": \"%s\", \"op\": \"sum\", \"root\": -1, \"iters\": %d, ",
          o->is_double ? "double" : "float", o->iters);
  fprintf(f, "\"warmup_iters\": %d, \"blocking\": true, \"check\": %s, \"date\": ", o->warmup_iters,
          o->check ? "true" : "false");
  json_string(f, date);
  fprintf(f, ", \"command\": ");
  json_string(f, command);
  fprintf(f, ", \"host\": ");
  json_string(f, host);
  fprintf(f, ", \"avg_busbw_gbps\": %.6f, \"wrong\": %lld},\n  \"results\": [\n", avg, wrong);
  for (int i = 0; i < n_rows; ++i) {
    fprintf(f,
            "    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"sum\", "
            "\"root\": -1, ",
            rows[i].bytes, rows[i].count, o->is_double ? "double" : "float");
    json_cell(f, "out_of_place", &rows[i].oop);
    fprintf(f, ", ");
    json_cell(f, "in_place", &rows[i].ip);
    fprintf(f, "}%s\n", i + 1 < n_rows ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  fclose(f);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  Options o = parse_options(argc, argv, rank);
  const size_t element = o.is_double ? 8 : 4;

  char command[4096] = "";
  for (int i = 0; i < argc; ++i) {
    strncat(command, argv[i], sizeof command - strlen(command) - 2);
    if (i + 1 < argc) strncat(command, " ", sizeof command - strlen(command) - 1);
  }
  char date[32], host[256] = "";
  time_t now = time(NULL);
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", localtime(&now));
  gethostname(host, sizeof host - 1);

  size_t max_count = o.max_bytes / element;
  if (max_count < o.min_bytes / element) max_count = o.min_bytes / element;
  void* send = malloc(max_count * element + 64);
  void* recv = malloc(max_count * element + 64);
  Row* rows = calloc(64, sizeof(Row));
  if (!send || !recv || !rows) {
    fprintf(stderr, "mpi_allreduce_perf: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    printf(
        "# mpi_allreduce_perf: nranks %d minBytes %zu maxBytes %zu step: %g(factor) "
        "warmup iters: %d iters: %d validation: %d\n",
        nranks, o.min_bytes, o.max_bytes, o.step_factor, o.warmup_iters, o.iters, o.check);
    printf("# Command: %s\n# Date: %s\n#\n", command, date);
    printf(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
        "in-place          \n",
        "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
           "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           "");
    fflush(stdout);
  }
  int n_rows = 0;
  double busbw_sum = 0;
  long long wrong = 0;
  unsigned seed = 0;
  size_t size = o.min_bytes;
  while (n_rows < 4096) {
    if (n_rows % 64 == 0 && n_rows > 0) rows = realloc(rows, sizeof(Row) * (size_t)(n_rows + 64));
    Row* row = &rows[n_rows++];
    row->count = size / element;
    row->bytes = row->count * element;
    row->oop = measure(&o, send, recv, row->count, 0, rank, nranks, seed);
    row->ip = measure(&o, send, recv, row->count, 1, rank, nranks, seed + 1);
    seed += 2;
    busbw_sum += row->oop.busbw + row->ip.busbw;
    if (row->oop.wrong > 0) wrong += row->oop.wrong;
    if (row->ip.wrong > 0) wrong += row->ip.wrong;
    if (rank == 0) {
      printf("%12zu  %12zu  %8s  %6s  %6d", row->bytes, row->count,
             o.is_double ? "double" : "float", "sum", -1);
      print_cell(&row->oop);
      print_cell(&row->ip);
      printf("\n");
      fflush(stdout);
    }
    size_t next = (size_t)((double)size * o.step_factor);
    if (next <= size || next > o.max_bytes) break;
    size = next;
  }
  double avg = busbw_sum / (2.0 * n_rows);
  if (rank == 0) {
    printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n#\n", avg);
    if (o.json_path) write_json(&o, rows, n_rows, nranks, command, date, host, avg, wrong);
  }
  free(rows);
  free(send);
  free(recv);
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
