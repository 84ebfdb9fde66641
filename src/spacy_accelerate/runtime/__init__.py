"""What every backend's session shares: the Session protocol, length groups, GPU buckets,
provider resolution basics.
"""
