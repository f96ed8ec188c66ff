// Helpers shared by the AMX-INT8 matmul tiles (matmul_amx.cpp, matmul_amx_kquants.cpp): tile
// configurations and the transpose that puts 16 weight rows' quants in TDPBSSD's B layout. Included
// only by translation units built with AMX flags; everything is in an unnamed namespace.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace kvtier::cpu {
namespace {

constexpr int kAmxRows = 16;        // weight rows per AMX call (= kRowAlign): one 512-bit vector of them
constexpr int kAmxTileTokens = 16;  // tokens per token tile (A's and C's rows)
constexpr int kAmxHalfTokens = 8;   // a call's last token tile when its group count is odd

// A tile configuration (palette 1). Built at compile time: GCC 12's _tile_loadconfig tells the
// compiler it reads only the first 8 bytes, so the stores of a configuration built at run time may
// be dropped as dead (the CPU then faults on the first tile instruction).
struct alignas(64) TileConfig {
  std::array<uint8_t, 64> bytes{};  // palette, start row, 14 reserved, colsb[16] (u16 LE), rows[16]
};

struct TileShape {
  int tile, rows, colsb;
};

constexpr TileConfig make_tile_config(std::initializer_list<TileShape> shapes) {
  TileConfig c;
  c.bytes[0] = 1;
  for (const TileShape& s : shapes) {
    c.bytes[16 + 2 * s.tile] = static_cast<uint8_t>(s.colsb & 0xff);
    c.bytes[17 + 2 * s.tile] = static_cast<uint8_t>(s.colsb >> 8);
    c.bytes[48 + s.tile] = static_cast<uint8_t>(s.rows);
  }
  return c;
}

// One chunk's token tiles of a call over n_tokens tokens (a multiple of 8): whole 16-token tiles under
// the configuration `full`, then a last 8-token tile under `half`, each as tile(t0, NT) with NT an
// std::integral_constant, so that the tile's accumulators can be a constant number of registers.
template <typename TileFn>
void for_token_tiles(int n_tokens, const TileConfig& full, const TileConfig& half, TileFn tile) {
  const int full_tiles = n_tokens / kAmxTileTokens;
  if (full_tiles > 0) _tile_loadconfig(full.bytes.data());
  for (int i = 0; i < full_tiles; ++i)
    tile(i * kAmxTileTokens, std::integral_constant<int, kAmxTileTokens>{});
  if (n_tokens % kAmxTileTokens != 0) {
    _tile_loadconfig(half.bytes.data());
    tile(full_tiles * kAmxTileTokens, std::integral_constant<int, kAmxHalfTokens>{});
  }
}

// v[i] = [row i's 32 bytes (8 dwords: 4-element groups), row i + 8's] for i < 8 -> out[j] (64 bytes)
// = the 16 rows' group j (dword r: row r), 8 rows of a B tile. The 8 x 8 dword transpose of each
// 256-bit half at once: 32- and 64-bit unpacks within 128-bit lanes, then lanes exchanged.
[[gnu::always_inline]] inline void transpose_groups(const __m512i (&v)[8], int8_t (*out)[kAmxRows * 4]) {
  __m512i t[8], q[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    q[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    q[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    q[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    q[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // q[c] (c < 4), 128-bit lane L: rows 0..3 of half L / 2 (rows 8 (L / 2) + 0..3) in group c + 4 (L % 2);
  // q[c + 4] the same for rows 4..7 of each half. Group c is lanes [q[c] 0, q[c + 4] 0, q[c] 2, q[c + 4] 2].
  for (int c = 0; c < 4; ++c) {
    const __m512i lo = _mm512_shuffle_i32x4(q[c], q[c + 4], _MM_SHUFFLE(2, 0, 2, 0));  // [a0 a2 b0 b2]
    const __m512i hi = _mm512_shuffle_i32x4(q[c], q[c + 4], _MM_SHUFFLE(3, 1, 3, 1));  // [a1 a3 b1 b3]
    _mm512_store_si512(out[c], _mm512_shuffle_i32x4(lo, lo, _MM_SHUFFLE(3, 1, 2, 0)));
    _mm512_store_si512(out[c + 4], _mm512_shuffle_i32x4(hi, hi, _MM_SHUFFLE(3, 1, 2, 0)));
  }
}

}  // namespace
}  // namespace kvtier::cpu
