// int8 dot throughput of Intel AMX (AMX-INT8): TDPBSSD of two 16 x 64 A tiles against two 16 x 64 B
// tiles into four independent 16 x 16 i32 C tiles, 4 x 16 x 16 x 64 signed products per iteration.
// Only called where cpu::uses_amx (the process then has Linux's grant of the tile state).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/amx_tiles.h"

namespace kvtier::bench {
namespace {

// Tiles 0..7 all 16 rows x 64 bytes.
constexpr cpu::TileConfig kConfig = cpu::make_tile_config(
    {{0, 16, 64}, {1, 16, 64}, {2, 16, 64}, {3, 16, 64}, {4, 16, 64}, {5, 16, 64}, {6, 16, 64}, {7, 16, 64}});

}  // namespace

int int8_loop_amx(int64_t iters) {
  alignas(64) int8_t a[16][64], b[16][64];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 64; ++j) {
      a[i][j] = static_cast<int8_t>(i + j);
      b[i][j] = static_cast<int8_t>(i - j);
    }
  _tile_loadconfig(kConfig.bytes.data());
  _tile_loadd(0, a, 64);
  _tile_loadd(1, b, 64);
  _tile_loadd(2, b, 64);
  _tile_loadd(3, a, 64);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbssd(4, 0, 2);
    _tile_dpbssd(5, 0, 3);
    _tile_dpbssd(6, 1, 2);
    _tile_dpbssd(7, 1, 3);
  }
  alignas(64) int32_t out[16][16];
  _tile_stored(4, out, 64);
  _tile_release();
  return out[0][0];
}

}  // namespace kvtier::bench
