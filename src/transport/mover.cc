#include "src/transport/mover.h"

#include <cstring>
#include <utility>

namespace strata::transport {

Mover::Mover(tier::Device* device, tier::NvmeStore* nvme)
    : device_(device), nvme_(nvme) {}

Result<tier::Event> Mover::Issue(const Place& from, const Place& to,
                                 uint64_t bytes) {
  if (from.tier == Tier::kHost && to.tier == Tier::kDevice) {
    return device_->CopyToDevice(to.ptr, from.ptr, bytes);
  }
  STRATA_CHECK(from.tier == Tier::kDevice && to.tier == Tier::kHost);
  return device_->CopyToHost(to.ptr, from.ptr, bytes);
}

void Mover::Count(Role role, const Place& from, const Place& to,
                  uint64_t bytes) {
  role_bytes_[static_cast<int>(role)][static_cast<int>(from.tier)]
             [static_cast<int>(to.tier)] += bytes;
}

Status Mover::Copy(Role role, const Place& from, const Place& to,
                   uint64_t bytes, std::shared_ptr<const tier::Digest> digest) {
  Status status;
  if (from.tier == Tier::kNvme && to.tier == Tier::kHost) {
    STRATA_CHECK(nvme_ != nullptr && from.extent.bytes == bytes);
    status = nvme_->Read(from.extent, to.ptr);
  } else if (from.tier == Tier::kHost && to.tier == Tier::kNvme) {
    STRATA_CHECK(nvme_ != nullptr && to.extent.bytes == bytes);
    status = nvme_->Write(to.extent, from.ptr, std::move(digest));
  } else {
    Result<tier::Event> event = Issue(from, to, bytes);
    status = event.ok() ? event->Wait() : event.status();
  }
  if (status.ok()) Count(role, from, to, bytes);
  return status;
}

Result<std::shared_ptr<const tier::Digest>> Mover::ReadUnchecked(
    Role role, const Place& from, const Place& to, uint64_t bytes) {
  STRATA_CHECK(nvme_ != nullptr && from.tier == Tier::kNvme &&
               to.tier == Tier::kHost && from.extent.bytes == bytes);
  STRATA_ASSIGN_OR_RETURN(
      tier::PendingIo io,
      nvme_->StartRead(from.extent, to.ptr, tier::ReadCheck::kCaller));
  STRATA_RETURN_IF_ERROR(nvme_->FinishIo(io));
  Count(role, from, to, bytes);
  return std::move(io.digest);
}

Result<tier::Event> Mover::Start(Role role, const Place& from, const Place& to,
                                 uint64_t bytes, const tier::Event& after) {
  if (!after.Poll()) {
    STRATA_RETURN_IF_ERROR(device_->OrderAfter(to.tier == Tier::kDevice
                                                   ? tier::Direction::kToDevice
                                                   : tier::Direction::kToHost,
                                               after));
  }
  STRATA_ASSIGN_OR_RETURN(tier::Event event, Issue(from, to, bytes));
  Count(role, from, to, bytes);
  return event;
}

Status Mover::Zero(const Place& to, uint64_t bytes) {
  switch (to.tier) {
    case Tier::kDevice:
      return device_->Memset(to.ptr, 0, bytes);
    case Tier::kHost:
      std::memset(to.ptr, 0, bytes);
      return Status();
    case Tier::kNvme:
      break;
  }
  STRATA_CHECK(false && "NVMe copies are written, never zero-filled");
  return Status();
}

EngineStats::TierBytes Mover::bytes() const {
  EngineStats::TierBytes out = {};
  for (const EngineStats::TierBytes& role : role_bytes()) {
    for (int a = 0; a < kNumTiers; ++a) {
      for (int b = 0; b < kNumTiers; ++b) out[a][b] += role[a][b];
    }
  }
  return out;
}

std::array<EngineStats::TierBytes, kNumRoles> Mover::role_bytes() const {
  std::array<EngineStats::TierBytes, kNumRoles> out = {};
  for (int r = 0; r < kNumRoles; ++r) {
    for (int a = 0; a < kNumTiers; ++a) {
      for (int b = 0; b < kNumTiers; ++b) {
        out[r][a][b] = role_bytes_[r][a][b].load();
      }
    }
  }
  return out;
}

}  // namespace strata::transport
